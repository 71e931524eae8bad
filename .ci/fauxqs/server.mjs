// Starts the fauxqs SQS emulator for berth's integration tests, bound to the
// loopback interface only (fauxqs's own CLI listens on every interface).
//
// Environment: FAUXQS_PORT (default 4566), FAUXQS_LOGGER ("true" to log requests).
// Account 000000000000, region us-east-1; any static credentials are accepted.
import { buildApp } from "fauxqs";

const port = Number.parseInt(process.env.FAUXQS_PORT ?? "4566", 10);
if (!Number.isInteger(port) || port <= 0 || port > 65535) {
  console.error(`fauxqs: invalid FAUXQS_PORT ${JSON.stringify(process.env.FAUXQS_PORT)}`);
  process.exit(2);
}

const app = buildApp({
  logger: process.env.FAUXQS_LOGGER === "true",
  defaultRegion: "us-east-1",
});

try {
  const address = await app.listen({ port, host: "127.0.0.1" });
  console.log(`fauxqs listening on ${address}`);
} catch (err) {
  console.error(`fauxqs: cannot listen on 127.0.0.1:${port}: ${err.message}`);
  process.exit(1);
}

for (const signal of ["SIGINT", "SIGTERM"]) {
  process.once(signal, () => {
    app.close().finally(() => process.exit(0));
  });
}
