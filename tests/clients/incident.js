// A deadlock or a lock wait made by node-postgres, in its extended protocol: every statement
// with parameters is Parse/Bind/Execute, unnamed, or named (a prepared statement) with "named".
// Usage: node incident.js '{"host": ..., "port": ..., "user": ..., "database": "shop"}' deadlock|lockwait extended|named
"use strict";
const { Client } = require("pg");

const [config, what, how] = [JSON.parse(process.argv[2]), process.argv[3], process.argv[4]];
let counter = 0;

function query(client, text, values) {
  counter += 1;
  return client.query(how === "named" ? { name: `incident-${counter}`, text, values } : { text, values });
}

async function connect(name) {
  const client = new Client({ ...config, application_name: name });
  await client.connect();
  return client;
}

async function blocked(admin, pid) {
  // Until the server reports pid waiting for a lock (what pgrace itself watches).
  for (let i = 0; i < 2000; i++) {
    const r = await admin.query("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", [pid]);
    if (r.rows.length && r.rows[0].wait_event_type === "Lock") return;
    await new Promise((done) => setTimeout(done, 5));
  }
  throw new Error(`pid ${pid} never waited`);
}

async function logged(admin, head, tail) {
  // Until the server's log says head + tail (log_lock_waits writes after deadlock_timeout); in two
  // parts, so that this query's own logged parameters do not say it.
  for (let i = 0; i < 1000; i++) {
    const r = await admin.query(
      "SELECT position($1 || $2 in pg_read_file(pg_current_logfile())) > 0 AS said", [head, tail]);
    if (r.rows[0].said) return;
    await new Promise((done) => setTimeout(done, 10));
  }
  throw new Error(`the log never said ${head}${tail}`);
}

async function deadlock(admin) {
  const alice = await connect("alice");
  const bob = await connect("bob");
  const pid = (await alice.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;
  await alice.query("SET deadlock_timeout = '10s'");
  await alice.query("BEGIN");
  await query(alice, "UPDATE accounts SET balance = balance - $1 WHERE id = $2", [100, 1]);
  await bob.query("BEGIN");
  await query(bob, "UPDATE accounts SET balance = balance - $1 WHERE id = $2", [50, 2]);
  const credit = query(alice, "UPDATE accounts SET balance = balance + $1 WHERE id = $2", [100, 2]);
  await blocked(admin, pid);
  try {
    await query(bob, "UPDATE accounts SET balance = balance + $1 WHERE id = $2", [50, 1]);
    throw new Error("bob was not the deadlock's victim");
  } catch (err) {
    if (err.code !== "40P01") throw err;
    await bob.query("ROLLBACK");
  }
  await credit;
  await alice.query("COMMIT");
  await alice.end();
  await bob.end();
}

async function lockwait(admin) {
  const report = await connect("report");
  const payment = await connect("payment");
  const pid = (await payment.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;
  await report.query("BEGIN");
  await query(report, "UPDATE accounts SET owner = $1 WHERE id = $2", ["carol", 3]);
  const paying = query(payment, "UPDATE accounts SET balance = balance + $1 WHERE id = $2", [1, 3]);
  await blocked(admin, pid);
  await logged(admin, "still waiting", " for");
  await report.query("COMMIT");
  await paying;
  await report.end();
  await payment.end();
}

(async () => {
  const admin = new Client({ ...config, database: "postgres" });
  await admin.connect();
  await (what === "deadlock" ? deadlock(admin) : lockwait(admin));
  await admin.end();
})().catch((err) => {
  console.error(err);
  process.exit(1);
});
