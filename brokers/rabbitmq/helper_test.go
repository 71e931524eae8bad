package rabbitmq

const helperEnv = "BERTH_RMQ_HELPER"
