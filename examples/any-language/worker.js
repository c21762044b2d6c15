// A queue worker with node-postgres: claim the next job with FOR UPDATE SKIP LOCKED, record the claim, mark it done;
// until no job is left (--once: one job at most). The worker's name is its first argument. Connects with DATABASE_URL.
const { Client } = require("pg");

async function main() {
  const worker = process.argv[2];
  const once = process.argv.includes("--once");
  const client = new Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  for (;;) {
    await client.query("BEGIN");
    const { rows } = await client.query(
      "SELECT id FROM jobs WHERE NOT done ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
    );
    if (rows.length === 0) {
      await client.query("COMMIT");
      break;
    }
    await client.query("INSERT INTO claims (job, worker) VALUES ($1, $2)", [rows[0].id, worker]);
    await client.query("UPDATE jobs SET done = true WHERE id = $1", [rows[0].id]);
    await client.query("COMMIT");
    if (once) {
      break;
    }
  }
  await client.end();
}

main().catch((error) => {
  console.error(error.message);
  process.exit(1);
});
