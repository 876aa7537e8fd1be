// node-postgres (pg 8) on connect, as an application or a tool over it does: a parameterized
// query and its fields, information_schema and pg_type reads. Prints one line per fact, so the
// output against PostgreSQL and against sluice can be compared.
//
//   node node_catalog.js DSN
const { Client } = require("pg");
(async () => {
  const c = new Client({ connectionString: process.argv[2] });
  await c.connect();
  const v = await c.query("SHOW server_version");
  console.log("server_version major:", v.rows[0].server_version.split(".")[0]);
  const r = await c.query("SELECT id, name, amount FROM t WHERE id = $1", [1]);
  console.log("fields:", r.fields.map((f) => [f.name, f.dataTypeID]));
  console.log("rows:", JSON.stringify(r.rows));
  const tables = await c.query("SELECT table_name, table_type FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1");
  console.log("tables:", JSON.stringify(tables.rows));
  const cols = await c.query("SELECT column_name, data_type, is_nullable FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position", ["t"]);
  console.log("columns:", JSON.stringify(cols.rows));
  const types = await c.query("SELECT oid, typname FROM pg_type WHERE typname IN ($1, $2, $3) ORDER BY oid", ["int4", "text", "numeric"]);
  console.log("types:", JSON.stringify(types.rows));
  // An array parameter: node-postgres sends it as text ('{1,2}'), its type left to the server.
  const any = await c.query("SELECT id, name FROM t WHERE id = ANY($1) ORDER BY id", [[1, 2]]);
  console.log("any int:", JSON.stringify(any.rows));
  const anyText = await c.query("SELECT id FROM t WHERE name <> ALL($1)", [["two", "three"]]);
  console.log("all text:", JSON.stringify(anyText.rows));
  // Orderings against a list (planned with its smallest or largest element).
  const orderings = await c.query(
    "SELECT id FROM t WHERE id < ANY($1) AND id >= ALL($2) AND name > ANY($3)", [[0, 2], [-1, 1], ["a"]]);
  console.log("< any, >= all, > any text:", JSON.stringify(orderings.rows));
  await c.end();
})().catch((e) => { console.error("FAILED: " + e.message); process.exit(1); });
