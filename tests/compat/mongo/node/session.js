// One app's session with the MongoDB Node.js driver: `node session.js URI`. Prints one JSON document with
// each step's result or error (code, codeName, labels), so that a run direct and a run through the sidecar
// can be compared (tests/compat/mongo/test_node_driver.py).
const { MongoClient } = require("mongodb");

async function step(out, name, fn) {
  try {
    out[name] = { ok: await fn() };
  } catch (e) {
    out[name] = { error: e.name, code: e.code ?? null, codeName: e.codeName ?? null,
                  labels: (e.errorLabels ?? []).slice().sort() };
  }
}

async function main() {
  const client = new MongoClient(process.argv[2], { serverSelectionTimeoutMS: 5000, retryWrites: false,
                                                    retryReads: false });
  const out = {};
  try {
    const items = client.db("shop").collection("items");
    await step(out, "drop", async () => { try { return await items.drop(); } catch { return false; } });
    await step(out, "insert_many", async () =>
      (await items.insertMany(Array.from({ length: 120 }, (_, i) => ({ _id: i, k: i % 5, s: "v".repeat(i)}))))
        .insertedCount);
    await step(out, "insert_duplicate", async () => (await items.insertOne({ _id: 3 })).insertedId);
    await step(out, "find_batches", async () =>
      (await items.find({ k: { $gte: 2 } }, { sort: { _id: -1 }, batchSize: 13 }).toArray()).map((d) => d._id));
    await step(out, "count", async () => await items.countDocuments({ k: 1 }));
    await step(out, "update", async () => (await items.updateOne({ _id: 5 }, { $set: { s: "changed" } })).modifiedCount);
    await step(out, "find_one", async () => await items.findOne({ _id: 5 }));
    await step(out, "ping", async () => (await client.db("admin").command({ ping: 1 })).ok);
  } finally {
    await client.close();
  }
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => { process.stderr.write(String(e && e.stack || e)); process.exit(1); });
