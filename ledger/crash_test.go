package ledger_test

const helperEnv = "BERTH_LEDGER_HELPER"

func helperProcess() {}
