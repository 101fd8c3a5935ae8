// Sends every call type with a Node SDK to the collector, each with its own messageId, flushes,
// and prints {"sent": [{type, messageId}, ...]} (or exits 1 naming the error).
// usage: node node_sdks.js segment|rudderstack COLLECTOR_URL WRITE_KEY RUN
const [sdk, url, writeKey, run] = process.argv.slice(2);
const { randomUUID } = require("node:crypto");

const userId = `user-${run}`;
const properties = { run, revenue: 9.99, nested: { list: [1, "two", null] } };
const calls = [
  ["track", { userId, event: "Order Completed", properties }],
  ["identify", { userId, traits: { run, email: "x@example.com" } }],
  ["page", { userId, category: "Docs", name: "Start", properties }],
  ["screen", { userId, name: "Settings", properties }],
  ["group", { userId, groupId: `group-${run}`, traits: { run, plan: "pro" } }],
  ["alias", { userId, previousId: `anon-${run}` }],
];
const errors = [];

async function main() {
  const sent = [];
  if (sdk === "segment") {
    const { Analytics } = require("@segment/analytics-node");
    const analytics = new Analytics({ writeKey, host: url, flushAt: 3, maxRetries: 2 });
    analytics.on("error", (error) => errors.push(String(error && error.reason || error)));
    for (const [type, params] of calls) {
      const messageId = randomUUID();
      analytics[type]({ ...params, messageId });
      sent.push({ type, messageId });
    }
    await analytics.closeAndFlush({ timeout: 20000 });
  } else {
    const Analytics = require("@rudderstack/rudder-sdk-node");
    const client = new Analytics(writeKey, {
      dataPlaneUrl: url,
      flushAt: 3,
      flushInterval: 200,
      retryCount: 2,
      errorHandler: (error) => errors.push(String(error)),
    });
    const delivered = [];
    for (const [type, params] of calls) {
      const messageId = randomUUID();
      delivered.push(
        new Promise((resolve, reject) =>
          client[type]({ ...params, messageId }, (error) => (error ? reject(error) : resolve())),
        ),
      );
      sent.push({ type, messageId });
    }
    client.flush();
    await Promise.all(delivered); // each call's callback runs once its batch was answered
  }
  if (errors.length) throw new Error(errors.join("; "));
  process.stdout.write(JSON.stringify({ sent }) + "\n");
}

main().then(
  () => process.exit(0),
  (error) => {
    process.stderr.write(`${error && error.stack || error}\n`);
    process.exit(1);
  },
);
