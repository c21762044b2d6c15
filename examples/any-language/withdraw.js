// A withdrawal as a Node application writes it, with node-postgres: read the balance, compute, write it back.
// --for-update locks the row as it reads it (the cure). Connects with DATABASE_URL.
const { Client } = require("pg");

async function main() {
  const client = new Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  const lock = process.argv.includes("--for-update") ? " FOR UPDATE" : "";
  await client.query("BEGIN");
  const { rows } = await client.query("SELECT balance FROM accounts WHERE id = 1" + lock);
  await client.query("UPDATE accounts SET balance = $1 WHERE id = 1", [rows[0].balance - 100]);
  await client.query("COMMIT");
  await client.end();
}

main().catch((error) => {
  console.error(error.message);
  process.exit(1);
});
