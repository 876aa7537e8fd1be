//! Postgres's catalog on the embedded engine, so that psql's `\d` family, JDBC, psycopg and GUI
//! tools can read what the engine holds: a `pg_catalog` schema whose tables are made from the
//! engine's own catalogs each time they are scanned, the functions those tools' catalog
//! queries call (`format_type`, `pg_table_is_visible`, `current_database`, …), and the few
//! rewrites of their SQL that DataFusion needs (`OPERATOR(pg_catalog.~)`, `COLLATE
//! pg_catalog.default`, `::pg_catalog.regclass`, `pg_catalog.`-qualified function names).
//!
//! Invariants:
//! - Every table any schema of the default catalog holds (`public`, `system`,
//!   `information_schema`, `pg_catalog` itself) is a row of `pg_class`, its columns rows of
//!   `pg_attribute` with the Postgres type each is sent as on the wire ([`type_oid`], the one
//!   mapping the server's encoder also uses), so a client's type lookups agree with the rows it
//!   receives.
//! - Object ids are stable: built-in types and schemas have Postgres's own oids; a table's oid
//!   is a hash of its qualified name (≥ 16384, where Postgres's user objects start), the same
//!   in every session and after a restart.
//! - What sluice does not have (indexes, constraints, policies, comments, inheritance,
//!   publications) is an empty table with Postgres's columns, never invented rows.

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use datafusion::arrow::array::{
    Array, ArrayRef, BooleanBuilder, Float64Builder, Int16Builder, Int32Builder, StringBuilder,
    UInt32Builder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{CatalogProviderList, SchemaProvider, Session, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::datasource::{MemTable, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature,
    Volatility,
};
use datafusion::physical_plan::ExecutionPlan;
use futures::FutureExt;

/// The catalog sluice's tables live in (DataFusion's default).
const CATALOG: &str = "datafusion";

/// The database every client is in, whatever name it connected with.
pub const DATABASE: &str = "sluice";

/// The Postgres version sluice answers as (`server_version`, `version()`): psql, JDBC and the
/// other drivers choose their catalog queries by it, and these are the ones this module
/// serves.
pub const SERVER_VERSION: &str = "15.0";

/// The `server_version` start-up parameter: the version, then what answers as it.
pub fn server_version() -> String {
    format!("{SERVER_VERSION} (sluice {})", env!("CARGO_PKG_VERSION"))
}

/// `version()`'s answer: a Postgres version first (drivers parse it), then what really runs.
pub fn version() -> String {
    format!(
        "PostgreSQL {SERVER_VERSION} (sluice {}, Apache DataFusion {}) on {}-{}",
        env!("CARGO_PKG_VERSION"),
        datafusion::DATAFUSION_VERSION,
        std::env::consts::ARCH,
        std::env::consts::OS
    )
}

/// The role that owns every object (sluice's tables are shared by all its users).
const OWNER: &str = "sluice";
const OWNER_OID: i64 = 10;
const DATABASE_OWNER_OID: i64 = 6171;
const PG_CATALOG_OID: i64 = 11;
const PUBLIC_OID: i64 = 2200;
const INFORMATION_SCHEMA_OID: i64 = 13_000;
const HEAP_OID: i64 = 2;
const DATABASE_OID: i64 = 5;
/// The schemas unqualified names resolve in (Postgres's default `search_path`).
const SEARCH_PATH: [&str; 2] = ["pg_catalog", "public"];

/// Registers the `pg_catalog` schema and its functions in `ctx`.
pub(crate) fn register(ctx: &SessionContext) -> Result<()> {
    let catalogs = Arc::downgrade(&ctx.state().catalog_list().clone());
    let catalog = ctx
        .catalog(CATALOG)
        .ok_or_else(|| DataFusionError::Internal("no default catalog".into()))?;
    for (name, tables) in [
        ("pg_catalog", TABLES),
        ("information_schema", INFORMATION_SCHEMA),
    ] {
        catalog.register_schema(
            name,
            Arc::new(PgCatalog {
                tables,
                catalogs: catalogs.clone(),
            }),
        )?;
    }
    for f in functions(catalogs) {
        ctx.register_udf(ScalarUDF::new_from_impl(f));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Types

/// A Postgres type sluice sends or describes.
struct PgType {
    oid: i64,
    name: &'static str,
    /// What `format_type` says (the SQL spelling).
    sql: &'static str,
    len: i16,
    category: &'static str,
    /// The array type of this type, or (for an array) its element type.
    array: i64,
    elem: i64,
}

macro_rules! types {
    ($(($oid:expr, $name:expr, $sql:expr, $len:expr, $cat:expr, $array:expr, $elem:expr)),* $(,)?) => {
        &[$(PgType { oid: $oid, name: $name, sql: $sql, len: $len, category: $cat, array: $array, elem: $elem }),*]
    };
}

const TYPES: &[PgType] = types![
    (16, "bool", "boolean", 1, "B", 1000, 0),
    (17, "bytea", "bytea", -1, "U", 1001, 0),
    (18, "char", "\"char\"", 1, "Z", 1002, 0),
    (19, "name", "name", 64, "S", 1003, 0),
    (20, "int8", "bigint", 8, "N", 1016, 0),
    (21, "int2", "smallint", 2, "N", 1005, 0),
    (23, "int4", "integer", 4, "N", 1007, 0),
    (25, "text", "text", -1, "S", 1009, 0),
    (26, "oid", "oid", 4, "N", 1028, 0),
    (114, "json", "json", -1, "U", 199, 0),
    (700, "float4", "real", 4, "N", 1021, 0),
    (701, "float8", "double precision", 8, "N", 1022, 0),
    (1042, "bpchar", "character", -1, "S", 1014, 0),
    (1043, "varchar", "character varying", -1, "S", 1015, 0),
    (1082, "date", "date", 4, "D", 1182, 0),
    (1083, "time", "time without time zone", 8, "D", 1183, 0),
    (
        1114,
        "timestamp",
        "timestamp without time zone",
        8,
        "D",
        1115,
        0
    ),
    (
        1184,
        "timestamptz",
        "timestamp with time zone",
        8,
        "D",
        1185,
        0
    ),
    (1186, "interval", "interval", 16, "T", 1187, 0),
    (1700, "numeric", "numeric", -1, "N", 1231, 0),
    (2950, "uuid", "uuid", 16, "U", 2951, 0),
    (3802, "jsonb", "jsonb", -1, "U", 3807, 0),
    (1000, "_bool", "boolean[]", -1, "A", 0, 16),
    (1005, "_int2", "smallint[]", -1, "A", 0, 21),
    (1007, "_int4", "integer[]", -1, "A", 0, 23),
    (1009, "_text", "text[]", -1, "A", 0, 25),
    (1016, "_int8", "bigint[]", -1, "A", 0, 20),
    (1021, "_float4", "real[]", -1, "A", 0, 700),
    (1022, "_float8", "double precision[]", -1, "A", 0, 701),
    (1015, "_varchar", "character varying[]", -1, "A", 0, 1043),
    (1028, "_oid", "oid[]", -1, "A", 0, 26),
];

/// The Postgres type (its oid) a column of Arrow type `dt` is sent as. Types without a faithful
/// Postgres form go out as `text`.
pub fn type_oid(dt: &DataType) -> u32 {
    match dt {
        DataType::Boolean => 16,
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => 21,
        DataType::Int32 | DataType::UInt16 => 23,
        DataType::Int64 | DataType::UInt64 => 20,
        // Postgres's one unsigned 32-bit type; the catalog's oid columns are UInt32.
        DataType::UInt32 => 26,
        DataType::Float16 | DataType::Float32 => 700,
        DataType::Float64 => 701,
        DataType::Binary | DataType::LargeBinary => 17,
        DataType::Date32 => 1082,
        DataType::Timestamp(_, None) => 1114,
        DataType::Timestamp(_, Some(_)) => 1184,
        DataType::Decimal128(p, _) if *p <= 28 => 1700,
        DataType::Interval(_) | DataType::Duration(_) => 1186,
        DataType::List(f) | DataType::LargeList(f) => match f.data_type() {
            DataType::Boolean => 1000,
            DataType::Int8 | DataType::Int16 | DataType::UInt8 => 1005,
            DataType::Int32 | DataType::UInt16 => 1007,
            DataType::Int64 | DataType::UInt32 => 1016,
            DataType::Float32 => 1021,
            DataType::Float64 => 1022,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => 1009,
            _ => 25,
        },
        _ => 25,
    }
}

/// The type modifier Postgres keeps beside a column of `dt` (`numeric(p, s)`), or -1.
fn type_modifier(dt: &DataType) -> i64 {
    match dt {
        DataType::Decimal128(p, s) if *p <= 28 => ((i64::from(*p) << 16) | i64::from(*s as u8)) + 4,
        _ => -1,
    }
}

fn pg_type(oid: i64) -> Option<&'static PgType> {
    TYPES.iter().find(|t| t.oid == oid)
}

/// `format_type(oid, typmod)`: the SQL name of a type, with its modifier.
fn format_type(oid: i64, typmod: Option<i64>) -> Option<String> {
    let t = pg_type(oid)?;
    Some(match (t.oid, typmod) {
        (1700, Some(m)) if m >= 4 => format!("numeric({},{})", (m - 4) >> 16, (m - 4) & 0xffff),
        (1043, Some(m)) if m >= 4 => format!("character varying({})", m - 4),
        (1042, Some(m)) if m >= 4 => format!("character({})", m - 4),
        _ => t.sql.to_string(),
    })
}

// ---------------------------------------------------------------------------------------------
// Object ids

/// A table's oid: a hash of its qualified name into Postgres's user-object range.
fn relation_oid(schema: &str, table: &str) -> i64 {
    16_384 + i64::from(fnv(&format!("{schema}.{table}")) % (i32::MAX as u32 - 16_384))
}

fn namespace_oid(schema: &str) -> i64 {
    match schema {
        "pg_catalog" => PG_CATALOG_OID,
        "public" => PUBLIC_OID,
        "information_schema" => INFORMATION_SCHEMA_OID,
        other => 16_384 + i64::from(fnv(other) % (i32::MAX as u32 - 16_384)),
    }
}

/// FNV-1a: stable across builds and platforms (std's hasher is not).
fn fnv(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

// ---------------------------------------------------------------------------------------------
// What the engine holds

struct Relation {
    oid: i64,
    schema: String,
    name: String,
    /// `r` table, `v` view.
    kind: &'static str,
    columns: SchemaRef,
    /// A view's `CREATE VIEW` as DataFusion keeps it ([`view_definition`] takes its query out
    /// where a table shows it; most catalog reads do not).
    create: Option<String>,
}

impl Relation {
    /// A view's query (NULL for a table).
    fn definition(&self) -> V {
        self.create
            .as_deref()
            .and_then(view_definition)
            .map_or(V::Null, V::T)
    }
}

/// The schemas of the default catalog and their tables, as of now.
async fn relations(
    catalogs: &Weak<dyn CatalogProviderList>,
) -> Result<(Vec<String>, Vec<Relation>)> {
    let catalog = catalogs
        .upgrade()
        .and_then(|c| c.catalog(CATALOG))
        .ok_or_else(|| DataFusionError::Internal("the engine's catalog is gone".into()))?;
    let mut schemas = catalog.schema_names();
    schemas.sort();
    let mut out = Vec::new();
    for schema in &schemas {
        let Some(provider) = catalog.schema(schema) else {
            continue;
        };
        let mut names = provider.table_names();
        names.sort();
        for name in names {
            let Some(table) = provider.table(&name).await? else {
                continue;
            };
            out.push(Relation {
                oid: relation_oid(schema, &name),
                kind: match table.table_type() {
                    TableType::View => "v",
                    _ => "r",
                },
                columns: table.schema(),
                create: table.get_table_definition().map(str::to_string),
                schema: schema.clone(),
                name,
            });
        }
    }
    Ok((schemas, out))
}

/// The default catalog's tables by oid (schema, table), by name only (no table is opened):
/// built at most once per function call, when a function of that call first looks an oid up,
/// so that a call over many rows probes a map instead of hashing every table's name per row.
struct Directory<'a> {
    catalogs: &'a Weak<dyn CatalogProviderList>,
    by_oid: std::cell::OnceCell<std::collections::HashMap<i64, (String, String)>>,
}

impl<'a> Directory<'a> {
    fn new(catalogs: &'a Weak<dyn CatalogProviderList>) -> Self {
        Directory {
            catalogs,
            by_oid: std::cell::OnceCell::new(),
        }
    }

    /// The schema and name of the table with `oid`.
    fn relation(&self, oid: i64) -> Option<(&str, &str)> {
        self.by_oid
            .get_or_init(|| {
                let mut map = std::collections::HashMap::new();
                if let Some(catalog) = self.catalogs.upgrade().and_then(|c| c.catalog(CATALOG)) {
                    for schema in catalog.schema_names() {
                        let Some(provider) = catalog.schema(&schema) else {
                            continue;
                        };
                        for table in provider.table_names() {
                            map.insert(relation_oid(&schema, &table), (schema.clone(), table));
                        }
                    }
                }
                map
            })
            .get(&oid)
            .map(|(schema, table)| (schema.as_str(), table.as_str()))
    }

    /// The schema of the table with `oid`.
    fn schema_of(&self, oid: i64) -> Option<&str> {
        self.relation(oid).map(|(schema, _)| schema)
    }

    /// The query of the view with `oid`. Opening a table is async in DataFusion; the default
    /// catalog's schemas are in memory, so it is ready at once (and NULL, as for a table, if
    /// it ever were not).
    fn view_definition(&self, oid: i64) -> Option<String> {
        let (schema, table) = self.relation(oid)?;
        let provider = self.catalogs.upgrade()?.catalog(CATALOG)?.schema(schema)?;
        let table = provider.table(table).now_or_never()?.ok()??;
        table.get_table_definition().and_then(view_definition)
    }
}

/// A view's query from the `CREATE VIEW` DataFusion keeps, as PostgreSQL's `pg_get_viewdef`
/// prints one: after a space, ended by a semicolon (not re-indented as PostgreSQL does).
fn view_definition(create: &str) -> Option<String> {
    use datafusion::sql::sqlparser::{ast::Statement, dialect::PostgreSqlDialect, parser::Parser};
    match Parser::parse_sql(&PostgreSqlDialect {}, create)
        .ok()?
        .as_slice()
    {
        [Statement::CreateView(view)] => Some(format!(" {};", view.query)),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Tables

#[derive(Clone, Copy)]
enum Kind {
    Oid,
    Int2,
    Int4,
    Real,
    Text,
    Bool,
    TextList,
    Int2List,
    OidList,
}

/// A value of a catalog row; a column a row does not name takes its column's default.
#[derive(Clone)]
enum V {
    Null,
    I(i64),
    F(f64),
    B(bool),
    T(String),
    S(&'static str),
}

struct Col {
    name: &'static str,
    kind: Kind,
    default: V,
}

const fn col(name: &'static str, kind: Kind, default: V) -> Col {
    Col {
        name,
        kind,
        default,
    }
}

use Kind::*;
use V::{Null as N, B, F, I, S};

/// Postgres's columns of each table this module serves, with the defaults of columns sluice has
/// nothing to say about.
fn columns(table: &str) -> Option<Vec<Col>> {
    Some(match table {
        "pg_namespace" => vec![
            col("oid", Oid, N),
            col("nspname", Text, N),
            col("nspowner", Oid, I(OWNER_OID)),
            col("nspacl", TextList, N),
        ],
        "pg_class" => vec![
            col("oid", Oid, N),
            col("relname", Text, N),
            col("relnamespace", Oid, N),
            col("reltype", Oid, I(0)),
            col("reloftype", Oid, I(0)),
            col("relowner", Oid, I(OWNER_OID)),
            col("relam", Oid, I(0)),
            col("relfilenode", Oid, I(0)),
            col("reltablespace", Oid, I(0)),
            col("relpages", Int4, I(0)),
            col("reltuples", Real, F(-1.0)),
            col("relallvisible", Int4, I(0)),
            col("reltoastrelid", Oid, I(0)),
            col("relhasindex", Bool, B(false)),
            col("relisshared", Bool, B(false)),
            col("relpersistence", Text, S("p")),
            col("relkind", Text, N),
            col("relnatts", Int2, I(0)),
            col("relchecks", Int2, I(0)),
            col("relhasrules", Bool, B(false)),
            col("relhastriggers", Bool, B(false)),
            col("relhassubclass", Bool, B(false)),
            col("relrowsecurity", Bool, B(false)),
            col("relforcerowsecurity", Bool, B(false)),
            col("relispopulated", Bool, B(true)),
            col("relreplident", Text, S("d")),
            col("relispartition", Bool, B(false)),
            col("relrewrite", Oid, I(0)),
            col("relacl", TextList, N),
            col("reloptions", TextList, N),
            col("relpartbound", Text, N),
        ],
        "pg_attribute" => vec![
            col("attrelid", Oid, N),
            col("attname", Text, N),
            col("atttypid", Oid, N),
            col("attstattarget", Int4, I(-1)),
            col("attlen", Int2, N),
            col("attnum", Int2, N),
            col("attndims", Int4, I(0)),
            col("attcacheoff", Int4, I(-1)),
            col("atttypmod", Int4, I(-1)),
            col("attbyval", Bool, B(false)),
            col("attalign", Text, S("i")),
            col("attstorage", Text, S("p")),
            col("attcompression", Text, S("")),
            col("attnotnull", Bool, B(false)),
            col("atthasdef", Bool, B(false)),
            col("atthasmissing", Bool, B(false)),
            col("attidentity", Text, S("")),
            col("attgenerated", Text, S("")),
            col("attisdropped", Bool, B(false)),
            col("attislocal", Bool, B(true)),
            col("attinhcount", Int4, I(0)),
            col("attcollation", Oid, I(0)),
            col("attacl", TextList, N),
            col("attoptions", TextList, N),
            col("attfdwoptions", TextList, N),
        ],
        "pg_type" => vec![
            col("oid", Oid, N),
            col("typname", Text, N),
            col("typnamespace", Oid, I(PG_CATALOG_OID)),
            col("typowner", Oid, I(OWNER_OID)),
            col("typlen", Int2, N),
            col("typbyval", Bool, B(false)),
            col("typtype", Text, S("b")),
            col("typcategory", Text, N),
            col("typispreferred", Bool, B(false)),
            col("typisdefined", Bool, B(true)),
            col("typdelim", Text, S(",")),
            col("typrelid", Oid, I(0)),
            col("typsubscript", Text, S("-")),
            col("typelem", Oid, I(0)),
            col("typarray", Oid, I(0)),
            col("typinput", Text, N),
            col("typoutput", Text, N),
            col("typreceive", Text, N),
            col("typsend", Text, N),
            col("typalign", Text, S("i")),
            col("typstorage", Text, S("p")),
            col("typnotnull", Bool, B(false)),
            col("typbasetype", Oid, I(0)),
            col("typtypmod", Int4, I(-1)),
            col("typndims", Int4, I(0)),
            col("typcollation", Oid, I(0)),
            col("typdefault", Text, N),
            col("typacl", TextList, N),
        ],
        "pg_am" => vec![
            col("oid", Oid, N),
            col("amname", Text, N),
            col("amhandler", Text, N),
            col("amtype", Text, N),
        ],
        "pg_attrdef" => vec![
            col("oid", Oid, N),
            col("adrelid", Oid, N),
            col("adnum", Int2, N),
            col("adbin", Text, N),
        ],
        "pg_collation" => vec![
            col("oid", Oid, N),
            col("collname", Text, N),
            col("collnamespace", Oid, I(PG_CATALOG_OID)),
            col("collowner", Oid, I(OWNER_OID)),
            col("collprovider", Text, S("d")),
            col("collisdeterministic", Bool, B(true)),
            col("collencoding", Int4, I(-1)),
            col("collcollate", Text, N),
            col("collctype", Text, N),
        ],
        "pg_index" => vec![
            col("indexrelid", Oid, N),
            col("indrelid", Oid, N),
            col("indnatts", Int2, N),
            col("indnkeyatts", Int2, N),
            col("indisunique", Bool, N),
            col("indnullsnotdistinct", Bool, N),
            col("indisprimary", Bool, N),
            col("indisexclusion", Bool, N),
            col("indimmediate", Bool, N),
            col("indisclustered", Bool, N),
            col("indisvalid", Bool, N),
            col("indcheckxmin", Bool, N),
            col("indisready", Bool, N),
            col("indislive", Bool, N),
            col("indisreplident", Bool, N),
            col("indkey", Int2List, N),
            col("indcollation", OidList, N),
            col("indclass", OidList, N),
            col("indoption", Int2List, N),
            col("indexprs", Text, N),
            col("indpred", Text, N),
        ],
        "pg_constraint" => vec![
            col("oid", Oid, N),
            col("conname", Text, N),
            col("connamespace", Oid, N),
            col("contype", Text, N),
            col("condeferrable", Bool, N),
            col("condeferred", Bool, N),
            col("convalidated", Bool, N),
            col("conrelid", Oid, N),
            col("contypid", Oid, N),
            col("conindid", Oid, N),
            col("conparentid", Oid, N),
            col("confrelid", Oid, N),
            col("confupdtype", Text, N),
            col("confdeltype", Text, N),
            col("confmatchtype", Text, N),
            col("conislocal", Bool, N),
            col("coninhcount", Int4, N),
            col("connoinherit", Bool, N),
            col("conkey", Int2List, N),
            col("confkey", Int2List, N),
            col("conbin", Text, N),
        ],
        "pg_policy" => vec![
            col("oid", Oid, N),
            col("polname", Text, N),
            col("polrelid", Oid, N),
            col("polcmd", Text, N),
            col("polpermissive", Bool, N),
            col("polroles", OidList, N),
            col("polqual", Text, N),
            col("polwithcheck", Text, N),
        ],
        "pg_roles" | "pg_authid" => vec![
            col("oid", Oid, N),
            col("rolname", Text, N),
            col("rolsuper", Bool, B(true)),
            col("rolinherit", Bool, B(true)),
            col("rolcreaterole", Bool, B(true)),
            col("rolcreatedb", Bool, B(true)),
            col("rolcanlogin", Bool, B(true)),
            col("rolreplication", Bool, B(true)),
            col("rolconnlimit", Int4, I(-1)),
            col("rolpassword", Text, S("********")),
            col("rolvaliduntil", Text, N),
            col("rolbypassrls", Bool, B(true)),
            col("rolconfig", TextList, N),
        ],
        "pg_user" => vec![
            col("usename", Text, N),
            col("usesysid", Oid, N),
            col("usecreatedb", Bool, B(true)),
            col("usesuper", Bool, B(true)),
            col("userepl", Bool, B(false)),
            col("usebypassrls", Bool, B(false)),
            col("passwd", Text, S("********")),
            col("valuntil", Text, N),
            col("useconfig", TextList, N),
        ],
        "pg_statistic_ext" => vec![
            col("oid", Oid, N),
            col("stxrelid", Oid, N),
            col("stxname", Text, N),
            col("stxnamespace", Oid, N),
            col("stxowner", Oid, N),
            col("stxstattarget", Int4, N),
            col("stxkeys", Int2List, N),
            col("stxkind", TextList, N),
        ],
        "pg_publication" => vec![
            col("oid", Oid, N),
            col("pubname", Text, N),
            col("pubowner", Oid, N),
            col("puballtables", Bool, N),
            col("pubinsert", Bool, N),
            col("pubupdate", Bool, N),
            col("pubdelete", Bool, N),
            col("pubtruncate", Bool, N),
            col("pubviaroot", Bool, N),
        ],
        "pg_publication_namespace" => vec![
            col("oid", Oid, N),
            col("pnpubid", Oid, N),
            col("pnnspid", Oid, N),
        ],
        "pg_publication_rel" => vec![
            col("oid", Oid, N),
            col("prpubid", Oid, N),
            col("prrelid", Oid, N),
            col("prqual", Text, N),
            col("prattrs", Int2List, N),
        ],
        "pg_auth_members" => vec![
            col("oid", Oid, N),
            col("roleid", Oid, N),
            col("member", Oid, N),
            col("grantor", Oid, N),
            col("admin_option", Bool, N),
        ],
        "pg_inherits" => vec![
            col("inhrelid", Oid, N),
            col("inhparent", Oid, N),
            col("inhseqno", Int4, N),
            col("inhdetachpending", Bool, N),
        ],
        "pg_description" => vec![
            col("objoid", Oid, N),
            col("classoid", Oid, N),
            col("objsubid", Int4, N),
            col("description", Text, N),
        ],
        "pg_enum" => vec![
            col("oid", Oid, N),
            col("enumtypid", Oid, N),
            col("enumsortorder", Real, N),
            col("enumlabel", Text, N),
        ],
        "pg_extension" => vec![
            col("oid", Oid, N),
            col("extname", Text, N),
            col("extowner", Oid, N),
            col("extnamespace", Oid, N),
            col("extrelocatable", Bool, N),
            col("extversion", Text, N),
        ],
        "pg_tablespace" => vec![
            col("oid", Oid, N),
            col("spcname", Text, N),
            col("spcowner", Oid, I(OWNER_OID)),
            col("spcacl", TextList, N),
            col("spcoptions", TextList, N),
        ],
        "pg_database" => vec![
            col("oid", Oid, N),
            col("datname", Text, N),
            col("datdba", Oid, I(OWNER_OID)),
            col("encoding", Int4, I(6)),
            col("datlocprovider", Text, S("c")),
            col("datistemplate", Bool, B(false)),
            col("datallowconn", Bool, B(true)),
            col("datconnlimit", Int4, I(-1)),
            col("datfrozenxid", Oid, I(0)),
            col("dattablespace", Oid, I(1663)),
            col("datcollate", Text, S("C.UTF-8")),
            col("datctype", Text, S("C.UTF-8")),
            col("daticulocale", Text, N),
            col("datcollversion", Text, N),
            col("datacl", TextList, N),
        ],
        "pg_proc" => vec![
            col("oid", Oid, N),
            col("proname", Text, N),
            col("pronamespace", Oid, I(PG_CATALOG_OID)),
            col("proowner", Oid, I(OWNER_OID)),
            col("prolang", Oid, I(12)),
            col("procost", Real, F(1.0)),
            col("prorows", Real, F(0.0)),
            col("provariadic", Oid, I(0)),
            col("prosupport", Text, S("-")),
            col("prokind", Text, N),
            col("prosecdef", Bool, B(false)),
            col("proleakproof", Bool, B(false)),
            col("proisstrict", Bool, B(false)),
            col("proretset", Bool, B(false)),
            col("provolatile", Text, N),
            col("proparallel", Text, S("s")),
            col("pronargs", Int2, I(0)),
            col("pronargdefaults", Int2, I(0)),
            col("prorettype", Oid, I(25)),
            col("proargtypes", Text, S("")),
            col("proallargtypes", OidList, N),
            col("proargmodes", TextList, N),
            col("proargnames", TextList, N),
            col("prosrc", Text, N),
            col("probin", Text, N),
            col("proconfig", TextList, N),
            col("proacl", TextList, N),
        ],
        "pg_tables" => vec![
            col("schemaname", Text, N),
            col("tablename", Text, N),
            col("tableowner", Text, S(OWNER)),
            col("tablespace", Text, N),
            col("hasindexes", Bool, B(false)),
            col("hasrules", Bool, B(false)),
            col("hastriggers", Bool, B(false)),
            col("rowsecurity", Bool, B(false)),
        ],
        "pg_views" => vec![
            col("schemaname", Text, N),
            col("viewname", Text, N),
            col("viewowner", Text, S(OWNER)),
            col("definition", Text, N),
        ],
        "pg_settings" => vec![
            col("name", Text, N),
            col("setting", Text, N),
            col("unit", Text, N),
            col("category", Text, S("DataFusion")),
            col("short_desc", Text, N),
            col("extra_desc", Text, N),
            col("context", Text, S("user")),
            col("vartype", Text, S("string")),
            col("source", Text, S("default")),
            col("min_val", Text, N),
            col("max_val", Text, N),
            col("enumvals", TextList, N),
            col("boot_val", Text, N),
            col("reset_val", Text, N),
            col("sourcefile", Text, N),
            col("sourceline", Int4, N),
            col("pending_restart", Bool, B(false)),
        ],
        "tables" => vec![
            col("table_catalog", Text, S(DATABASE)),
            col("table_schema", Text, N),
            col("table_name", Text, N),
            col("table_type", Text, N),
            col("self_referencing_column_name", Text, N),
            col("reference_generation", Text, N),
            col("user_defined_type_catalog", Text, N),
            col("user_defined_type_schema", Text, N),
            col("user_defined_type_name", Text, N),
            col("is_insertable_into", Text, S("YES")),
            col("is_typed", Text, S("NO")),
            col("commit_action", Text, N),
        ],
        "columns" => vec![
            col("table_catalog", Text, S(DATABASE)),
            col("table_schema", Text, N),
            col("table_name", Text, N),
            col("column_name", Text, N),
            col("ordinal_position", Int4, N),
            col("column_default", Text, N),
            col("is_nullable", Text, N),
            col("data_type", Text, N),
            col("character_maximum_length", Int4, N),
            col("character_octet_length", Int4, N),
            col("numeric_precision", Int4, N),
            col("numeric_precision_radix", Int4, N),
            col("numeric_scale", Int4, N),
            col("datetime_precision", Int4, N),
            col("udt_catalog", Text, S(DATABASE)),
            col("udt_schema", Text, S("pg_catalog")),
            col("udt_name", Text, N),
            col("is_identity", Text, S("NO")),
            col("is_generated", Text, S("NEVER")),
            col("is_updatable", Text, S("YES")),
        ],
        "schemata" => vec![
            col("catalog_name", Text, S(DATABASE)),
            col("schema_name", Text, N),
            col("schema_owner", Text, S(OWNER)),
            col("default_character_set_catalog", Text, N),
            col("default_character_set_schema", Text, N),
            col("default_character_set_name", Text, N),
            col("sql_path", Text, N),
        ],
        "views" => vec![
            col("table_catalog", Text, S(DATABASE)),
            col("table_schema", Text, N),
            col("table_name", Text, N),
            col("view_definition", Text, N),
            col("check_option", Text, S("NONE")),
            col("is_updatable", Text, S("NO")),
            col("is_insertable_into", Text, S("NO")),
        ],
        "df_settings" => vec![
            col("name", Text, N),
            col("value", Text, N),
            col("description", Text, N),
        ],
        _ => return None,
    })
}

/// The tables of `pg_catalog`, in the order `\dt pg_catalog.*` lists them.
const TABLES: &[&str] = &[
    "pg_am",
    "pg_attrdef",
    "pg_attribute",
    "pg_auth_members",
    "pg_authid",
    "pg_class",
    "pg_collation",
    "pg_constraint",
    "pg_database",
    "pg_description",
    "pg_enum",
    "pg_extension",
    "pg_index",
    "pg_inherits",
    "pg_namespace",
    "pg_policy",
    "pg_proc",
    "pg_publication",
    "pg_publication_namespace",
    "pg_publication_rel",
    "pg_roles",
    "pg_settings",
    "pg_statistic_ext",
    "pg_tables",
    "pg_tablespace",
    "pg_type",
    "pg_user",
    "pg_views",
];

/// The tables sluice never has a row for: it has no indexes, constraints, column defaults,
/// policies, comments, inheritance, publications, extensions, enums, extended statistics or
/// collations of its own (every column uses the database's one collation, so `attcollation`
/// is 0 as for a type without one). A query that reads one of them (not outer-joined) has no
/// rows, whatever else it says.
const ALWAYS_EMPTY: &[&str] = &[
    "pg_attrdef",
    "pg_auth_members",
    "pg_collation",
    "pg_constraint",
    "pg_description",
    "pg_enum",
    "pg_extension",
    "pg_index",
    "pg_inherits",
    "pg_policy",
    "pg_publication",
    "pg_publication_namespace",
    "pg_publication_rel",
    "pg_statistic_ext",
];

/// The views of `information_schema` as Postgres has them, and DataFusion's `df_settings`
/// (which its `SHOW` reads).
const INFORMATION_SCHEMA: &[&str] = &["columns", "df_settings", "schemata", "tables", "views"];

/// Whether `name` is one of `pg_catalog`'s tables.
pub(crate) fn is_catalog_table(name: &str) -> bool {
    TABLES.contains(&name)
}

fn arrow_type(kind: Kind) -> DataType {
    let list = |t: DataType| DataType::List(Arc::new(Field::new("item", t, true)));
    match kind {
        Oid => DataType::UInt32,
        Int2 => DataType::Int16,
        Int4 => DataType::Int32,
        Real => DataType::Float64,
        Text => DataType::Utf8,
        Bool => DataType::Boolean,
        TextList => list(DataType::Utf8),
        Int2List => list(DataType::Int16),
        OidList => list(DataType::Int64),
    }
}

fn schema_of(cols: &[Col]) -> SchemaRef {
    Arc::new(Schema::new(
        cols.iter()
            .map(|c| Field::new(c.name, arrow_type(c.kind), true))
            .collect::<Vec<_>>(),
    ))
}

/// One column of rows: each row's value for `c`, or `c`'s default.
fn column(c: &Col, rows: &[Vec<(&'static str, V)>]) -> Result<ArrayRef> {
    let values = rows.iter().map(|r| {
        r.iter()
            .find(|(n, _)| *n == c.name)
            .map_or(&c.default, |(_, v)| v)
    });
    let bad = |v: &V| {
        DataFusionError::Internal(format!(
            "pg_catalog: bad value for {}: {}",
            c.name,
            matches!(v, V::Null)
        ))
    };
    Ok(match c.kind {
        Oid | Int2 | Int4 => {
            let ints = values
                .map(|v| match v {
                    V::Null => Ok(None),
                    V::I(i) => Ok(Some(*i)),
                    other => Err(bad(other)),
                })
                .collect::<Result<Vec<_>>>()?;
            match c.kind {
                Oid => {
                    let mut b = UInt32Builder::new();
                    ints.into_iter()
                        .for_each(|v| b.append_option(v.map(|v| v as u32)));
                    Arc::new(b.finish())
                }
                Int2 => {
                    let mut b = Int16Builder::new();
                    ints.into_iter()
                        .for_each(|v| b.append_option(v.map(|v| v as i16)));
                    Arc::new(b.finish())
                }
                _ => {
                    let mut b = Int32Builder::new();
                    ints.into_iter()
                        .for_each(|v| b.append_option(v.map(|v| v as i32)));
                    Arc::new(b.finish())
                }
            }
        }
        Real => {
            let mut b = Float64Builder::new();
            for v in values {
                match v {
                    V::Null => b.append_null(),
                    V::F(f) => b.append_value(*f),
                    V::I(i) => b.append_value(*i as f64),
                    other => return Err(bad(other)),
                }
            }
            Arc::new(b.finish())
        }
        Text => {
            let mut b = StringBuilder::new();
            for v in values {
                match v {
                    V::Null => b.append_null(),
                    V::T(s) => b.append_value(s),
                    V::S(s) => b.append_value(s),
                    other => return Err(bad(other)),
                }
            }
            Arc::new(b.finish())
        }
        Bool => {
            let mut b = BooleanBuilder::new();
            for v in values {
                match v {
                    V::Null => b.append_null(),
                    V::B(x) => b.append_value(*x),
                    other => return Err(bad(other)),
                }
            }
            Arc::new(b.finish())
        }
        // No catalog row has an array value (ACLs, options, keys): sluice has none of them.
        TextList | Int2List | OidList => {
            let n = values
                .map(|v| match v {
                    V::Null => Ok(()),
                    other => Err(bad(other)),
                })
                .collect::<Result<Vec<_>>>()?
                .len();
            datafusion::arrow::array::new_null_array(&arrow_type(c.kind), n)
        }
    })
}

fn t(s: &str) -> V {
    V::T(s.to_string())
}

/// The rows of `table` as of now.
async fn rows(
    table: &str,
    catalogs: &Weak<dyn CatalogProviderList>,
    state: &dyn Session,
) -> Result<Vec<Vec<(&'static str, V)>>> {
    let needs_relations = matches!(
        table,
        "pg_namespace"
            | "pg_class"
            | "pg_attribute"
            | "pg_tables"
            | "pg_views"
            | "tables"
            | "columns"
            | "schemata"
            | "views"
    );
    let (schemas, relations) = if needs_relations {
        relations(catalogs).await?
    } else {
        (Vec::new(), Vec::new())
    };
    Ok(match table {
        // As in Postgres 15, `public` belongs to whoever owns the database.
        "pg_namespace" => schemas
            .iter()
            .map(|s| {
                let owner = if s == "public" {
                    DATABASE_OWNER_OID
                } else {
                    OWNER_OID
                };
                vec![
                    ("oid", I(namespace_oid(s))),
                    ("nspname", t(s)),
                    ("nspowner", I(owner)),
                ]
            })
            .collect(),
        "pg_class" => relations
            .iter()
            .map(|r| {
                vec![
                    ("oid", I(r.oid)),
                    ("relname", t(&r.name)),
                    ("relnamespace", I(namespace_oid(&r.schema))),
                    ("relkind", S(r.kind)),
                    ("relam", I(if r.kind == "r" { HEAP_OID } else { 0 })),
                    ("relnatts", I(r.columns.fields().len() as i64)),
                ]
            })
            .collect(),
        "pg_attribute" => relations
            .iter()
            .flat_map(|r| {
                r.columns.fields().iter().enumerate().map(|(i, f)| {
                    let oid = i64::from(type_oid(f.data_type()));
                    let ty = pg_type(oid);
                    let len = ty.map_or(-1, |t| t.len);
                    vec![
                        ("attrelid", I(r.oid)),
                        ("attname", t(f.name())),
                        ("atttypid", I(oid)),
                        ("attlen", I(i64::from(len))),
                        ("attnum", I(i as i64 + 1)),
                        ("atttypmod", I(type_modifier(f.data_type()))),
                        ("attbyval", B(len > 0 && len <= 8)),
                        (
                            "attstorage",
                            S(match oid {
                                1700 => "m",
                                _ if len < 0 => "x",
                                _ => "p",
                            }),
                        ),
                        // PostgreSQL keeps NOT NULL only on a table's own columns: a view's
                        // are nullable whatever the planner infers of them.
                        ("attnotnull", B(r.kind == "r" && !f.is_nullable())),
                    ]
                })
            })
            .collect(),
        "pg_tables" | "pg_views" => relations
            .iter()
            .filter(|r| (r.kind == "v") == (table == "pg_views"))
            .map(|r| {
                if table == "pg_views" {
                    vec![
                        ("schemaname", t(&r.schema)),
                        ("viewname", t(&r.name)),
                        ("definition", r.definition()),
                    ]
                } else {
                    vec![("schemaname", t(&r.schema)), ("tablename", t(&r.name))]
                }
            })
            .collect(),
        "pg_type" => TYPES
            .iter()
            .map(|ty| {
                vec![
                    ("oid", I(ty.oid)),
                    ("typname", S(ty.name)),
                    ("typlen", I(i64::from(ty.len))),
                    ("typbyval", B(ty.len > 0 && ty.len <= 8)),
                    ("typcategory", S(ty.category)),
                    ("typelem", I(ty.elem)),
                    ("typarray", I(ty.array)),
                    // Postgres's I/O functions: an array type's are `array_in`, ….
                    ("typinput", io_function(ty.name, "in")),
                    ("typoutput", io_function(ty.name, "out")),
                    ("typreceive", io_function(ty.name, "recv")),
                    ("typsend", io_function(ty.name, "send")),
                    ("typstorage", S(if ty.len < 0 { "x" } else { "p" })),
                ]
            })
            .collect(),
        "pg_am" => vec![vec![
            ("oid", I(HEAP_OID)),
            ("amname", S("heap")),
            ("amhandler", S("heap_tableam_handler")),
            ("amtype", S("t")),
        ]],
        "pg_roles" | "pg_authid" => vec![
            vec![("oid", I(OWNER_OID)), ("rolname", S(OWNER))],
            vec![
                ("oid", I(DATABASE_OWNER_OID)),
                ("rolname", S("pg_database_owner")),
                ("rolsuper", B(false)),
                ("rolcreaterole", B(false)),
                ("rolcreatedb", B(false)),
                ("rolreplication", B(false)),
                ("rolbypassrls", B(false)),
                ("rolcanlogin", B(false)),
            ],
        ],
        "pg_user" => vec![vec![("usename", S(OWNER)), ("usesysid", I(OWNER_OID))]],
        "pg_tablespace" => vec![
            vec![("oid", I(1663)), ("spcname", S("pg_default"))],
            vec![("oid", I(1664)), ("spcname", S("pg_global"))],
        ],
        "pg_database" => vec![vec![("oid", I(DATABASE_OID)), ("datname", S(DATABASE))]],
        "pg_proc" => {
            let mut names: Vec<(&str, &str, Volatility)> = Vec::new();
            for (name, f) in state.scalar_functions() {
                names.push((name, "f", f.signature().volatility));
            }
            for (name, f) in state.aggregate_functions() {
                names.push((name, "a", f.signature().volatility));
            }
            for (name, f) in state.window_functions() {
                names.push((name, "w", f.signature().volatility));
            }
            names.sort();
            names
                .into_iter()
                .map(|(name, kind, volatility)| {
                    vec![
                        ("oid", I(relation_oid("pg_proc", name))),
                        ("proname", t(name)),
                        ("prokind", S(kind)),
                        (
                            "provolatile",
                            S(match volatility {
                                Volatility::Immutable => "i",
                                Volatility::Stable => "s",
                                Volatility::Volatile => "v",
                            }),
                        ),
                        ("prosrc", t(name)),
                    ]
                })
                .collect()
        }
        "schemata" => schemas
            .iter()
            .map(|s| vec![("schema_name", t(s))])
            .collect(),
        "tables" => relations
            .iter()
            .map(|r| {
                vec![
                    ("table_schema", t(&r.schema)),
                    ("table_name", t(&r.name)),
                    (
                        "table_type",
                        S(if r.kind == "v" { "VIEW" } else { "BASE TABLE" }),
                    ),
                ]
            })
            .collect(),
        "views" => relations
            .iter()
            .filter(|r| r.kind == "v")
            .map(|r| {
                vec![
                    ("table_schema", t(&r.schema)),
                    ("table_name", t(&r.name)),
                    ("view_definition", r.definition()),
                ]
            })
            .collect(),
        "columns" => relations
            .iter()
            .flat_map(|r| {
                r.columns.fields().iter().enumerate().map(|(i, f)| {
                    let oid = i64::from(type_oid(f.data_type()));
                    let ty = pg_type(oid);
                    let (precision, scale) = match f.data_type() {
                        DataType::Decimal128(p, s) if *p <= 28 => {
                            (Some(i64::from(*p)), Some(i64::from(*s)))
                        }
                        DataType::Int16 | DataType::Int8 | DataType::UInt8 => (Some(16), Some(0)),
                        DataType::Int32 | DataType::UInt16 => (Some(32), Some(0)),
                        DataType::Int64 | DataType::UInt32 | DataType::UInt64 => {
                            (Some(64), Some(0))
                        }
                        DataType::Float32 | DataType::Float16 => (Some(24), None),
                        DataType::Float64 => (Some(53), None),
                        _ => (None, None),
                    };
                    let opt = |v: Option<i64>| v.map_or(V::Null, I);
                    vec![
                        ("table_schema", t(&r.schema)),
                        ("table_name", t(&r.name)),
                        ("column_name", t(f.name())),
                        ("ordinal_position", I(i as i64 + 1)),
                        ("is_nullable", S(if f.is_nullable() { "YES" } else { "NO" })),
                        (
                            "data_type",
                            match ty {
                                Some(t) if t.category == "A" => S("ARRAY"),
                                Some(t) => S(t.sql),
                                None => S("text"),
                            },
                        ),
                        ("numeric_precision", opt(precision)),
                        (
                            "numeric_precision_radix",
                            opt(precision.map(|_| if oid == 1700 { 10 } else { 2 })),
                        ),
                        ("numeric_scale", opt(scale)),
                        ("udt_name", S(ty.map_or("text", |t| t.name))),
                    ]
                })
            })
            .collect(),
        "df_settings" => state
            .config_options()
            .entries()
            .into_iter()
            .map(|e| {
                vec![
                    ("name", t(&e.key)),
                    ("value", e.value.map_or(V::Null, V::T)),
                    ("description", t(e.description)),
                ]
            })
            .collect(),
        "pg_settings" => PRESETS
            .iter()
            .map(|&(name, value, vartype, description)| {
                vec![
                    ("name", S(name)),
                    ("setting", S(value)),
                    ("category", S("Preset Options")),
                    ("short_desc", S(description)),
                    ("context", S("internal")),
                    ("vartype", S(vartype)),
                    ("boot_val", S(value)),
                    ("reset_val", S(value)),
                ]
            })
            .chain(state.config_options().entries().into_iter().map(|e| {
                let value = e.value.unwrap_or_default();
                vec![
                    ("name", t(&e.key)),
                    ("setting", t(&value)),
                    ("short_desc", t(e.description)),
                    ("boot_val", t(&value)),
                    ("reset_val", t(&value)),
                ]
            }))
            .collect(),
        _ => Vec::new(),
    })
}

/// The name of type `name`'s input, output, receive or send function (`suffix` `in`, `out`,
/// `recv`, `send`), as `pg_type` names it: `int4in`, and for every array type `array_in`.
fn io_function(name: &str, suffix: &str) -> V {
    if name.starts_with('_') {
        V::T(format!("array_{suffix}"))
    } else {
        V::T(format!("{name}{suffix}"))
    }
}

/// PostgreSQL's read-only "preset options" that drivers read from `pg_settings` before they
/// build a catalog query (pgjdbc's `getImportedKeys` asks for `max_index_keys`), with
/// PostgreSQL's values: name, setting, type, description.
const PRESETS: [(&str, &str, &str, &str); 6] = [
    (
        "block_size",
        "8192",
        "integer",
        "Shows the size of a disk block.",
    ),
    (
        "integer_datetimes",
        "on",
        "bool",
        "Shows whether datetimes are integer based.",
    ),
    (
        "max_function_args",
        "100",
        "integer",
        "Shows the maximum number of function arguments.",
    ),
    (
        "max_identifier_length",
        "63",
        "integer",
        "Shows the maximum identifier length.",
    ),
    (
        "max_index_keys",
        "32",
        "integer",
        "Shows the maximum number of index keys.",
    ),
    (
        "server_encoding",
        "UTF8",
        "string",
        "Shows the server (database) character set encoding.",
    ),
];

// ---------------------------------------------------------------------------------------------
// The schema and its tables

/// The `pg_catalog` schema: each table made anew from the engine's catalogs when scanned.
struct PgCatalog {
    tables: &'static [&'static str],
    catalogs: Weak<dyn CatalogProviderList>,
}

impl std::fmt::Debug for PgCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PgCatalog")
    }
}

#[async_trait]
impl SchemaProvider for PgCatalog {
    fn table_names(&self) -> Vec<String> {
        self.tables.iter().map(|t| t.to_string()).collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        Ok(self.tables.iter().find(|t| **t == name).and_then(|name| {
            let cols = columns(name)?;
            Some(Arc::new(CatalogTable {
                name,
                schema: schema_of(&cols),
                cols,
                catalogs: self.catalogs.clone(),
            }) as Arc<dyn TableProvider>)
        }))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.tables.contains(&name)
    }
}

struct CatalogTable {
    name: &'static str,
    schema: SchemaRef,
    cols: Vec<Col>,
    catalogs: Weak<dyn CatalogProviderList>,
}

impl std::fmt::Debug for CatalogTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pg_catalog.{}", self.name)
    }
}

#[async_trait]
impl TableProvider for CatalogTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let rows = rows(self.name, &self.catalogs, state).await?;
        let columns = self
            .cols
            .iter()
            .map(|c| column(c, &rows))
            .collect::<Result<Vec<_>>>()?;
        let batch = RecordBatch::try_new(self.schema.clone(), columns)?;
        MemTable::try_new(self.schema.clone(), vec![vec![batch]])?
            .scan(state, projection, filters, limit)
            .await
    }
}

// ---------------------------------------------------------------------------------------------
// Functions

type Eval = dyn Fn(&[ScalarValue], &Directory<'_>) -> ScalarValue + Send + Sync;

/// A function catalog queries call, evaluated row by row (catalogs are small).
struct PgFunction {
    name: &'static str,
    signature: Signature,
    returns: DataType,
    eval: Arc<Eval>,
    /// What [`Directory`] reads for the functions that look tables up by oid.
    catalogs: Weak<dyn CatalogProviderList>,
}

impl std::fmt::Debug for PgFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

// One function per name in a session: equal and hashed by name.
impl PartialEq for PgFunction {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}
impl Eq for PgFunction {}
impl std::hash::Hash for PgFunction {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl ScalarUDFImpl for PgFunction {
    fn name(&self) -> &str {
        self.name
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(self.returns.clone())
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let row = |i: usize| -> Result<Vec<ScalarValue>> {
            args.args
                .iter()
                .map(|a| match a {
                    ColumnarValue::Scalar(v) => Ok(v.clone()),
                    ColumnarValue::Array(a) => ScalarValue::try_from_array(a, i),
                })
                .collect()
        };
        let cast = |v: ScalarValue| -> Result<ScalarValue> {
            if v.is_null() {
                ScalarValue::try_from(&self.returns)
            } else {
                v.cast_to(&self.returns)
            }
        };
        let directory = Directory::new(&self.catalogs);
        if scalar {
            return Ok(ColumnarValue::Scalar(cast((self.eval)(
                &row(0)?,
                &directory,
            ))?));
        }
        if args.number_rows == 0 {
            // No rows (psql's `\di` over no indexes): nothing to evaluate.
            return Ok(ColumnarValue::Array(
                datafusion::arrow::array::new_empty_array(&self.returns),
            ));
        }
        let values = (0..args.number_rows)
            .map(|i| cast((self.eval)(&row(i)?, &directory)))
            .collect::<Result<Vec<_>>>()?;
        Ok(ColumnarValue::Array(ScalarValue::iter_to_array(values)?))
    }
}

/// A function of its arguments only.
fn function(
    name: &'static str,
    arities: &[usize],
    returns: DataType,
    eval: impl Fn(&[ScalarValue]) -> ScalarValue + Send + Sync + 'static,
) -> PgFunction {
    lookup(name, arities, returns, move |args, _| eval(args))
}

/// A function that also looks tables up by oid (its [`PgFunction::catalogs`] is set by
/// [`functions`]).
fn lookup(
    name: &'static str,
    arities: &[usize],
    returns: DataType,
    eval: impl Fn(&[ScalarValue], &Directory<'_>) -> ScalarValue + Send + Sync + 'static,
) -> PgFunction {
    let signatures = arities
        .iter()
        .map(|&n| match n {
            0 => TypeSignature::Nullary,
            n => TypeSignature::Any(n),
        })
        .collect::<Vec<_>>();
    PgFunction {
        name,
        signature: Signature::one_of(signatures, Volatility::Stable),
        returns,
        eval: Arc::new(eval),
        catalogs: Weak::<datafusion::catalog::MemoryCatalogProviderList>::new(),
    }
}

fn int(v: &ScalarValue) -> Option<i64> {
    match v.cast_to(&DataType::Int64).ok()? {
        ScalarValue::Int64(i) => i,
        _ => None,
    }
}

fn text(v: &ScalarValue) -> Option<String> {
    match v.cast_to(&DataType::Utf8).ok()? {
        ScalarValue::Utf8(s) => s,
        _ => None,
    }
}

fn utf8(s: Option<String>) -> ScalarValue {
    ScalarValue::Utf8(s)
}

/// The functions of clients' catalog queries. What sluice has nothing for (column defaults,
/// index and constraint definitions, comments) is NULL, as Postgres answers for an object
/// without one.
fn functions(catalogs: Weak<dyn CatalogProviderList>) -> Vec<PgFunction> {
    let none = |_: &[ScalarValue]| ScalarValue::Utf8(None);
    let yes = |_: &[ScalarValue]| ScalarValue::Boolean(Some(true));
    let all = vec![
        function("version", &[0], DataType::Utf8, |_| utf8(Some(version()))),
        function("current_database", &[0], DataType::Utf8, |_| {
            utf8(Some(DATABASE.into()))
        }),
        function("current_catalog", &[0], DataType::Utf8, |_| {
            utf8(Some(DATABASE.into()))
        }),
        function("current_schema", &[0], DataType::Utf8, |_| {
            utf8(Some("public".into()))
        }),
        function(
            "current_schemas",
            &[1],
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            |args| {
                let implicit = matches!(args[0], ScalarValue::Boolean(Some(true)));
                let schemas = SEARCH_PATH
                    .iter()
                    .filter(|s| implicit || **s != "pg_catalog")
                    .map(|s| ScalarValue::Utf8(Some(s.to_string())))
                    .collect::<Vec<_>>();
                ScalarValue::List(ScalarValue::new_list_nullable(&schemas, &DataType::Utf8))
            },
        ),
        function("pg_get_userbyid", &[1], DataType::Utf8, |args| {
            utf8(int(&args[0]).map(|oid| {
                if oid == OWNER_OID {
                    OWNER.to_string()
                } else if oid == DATABASE_OWNER_OID {
                    "pg_database_owner".to_string()
                } else {
                    format!("unknown (OID={oid})")
                }
            }))
        }),
        lookup(
            "pg_table_is_visible",
            &[1],
            DataType::Boolean,
            |args, tables| {
                ScalarValue::Boolean(
                    int(&args[0])
                        .and_then(|oid| tables.schema_of(oid))
                        .map(|schema| SEARCH_PATH.contains(&schema)),
                )
            },
        ),
        function("pg_type_is_visible", &[1], DataType::Boolean, yes),
        function("pg_function_is_visible", &[1], DataType::Boolean, yes),
        function("format_type", &[2], DataType::Utf8, |args| {
            utf8(int(&args[0]).and_then(|oid| format_type(oid, int(&args[1]))))
        }),
        function("pg_get_expr", &[2, 3], DataType::Utf8, none),
        function("pg_get_indexdef", &[1, 3], DataType::Utf8, none),
        function("pg_get_constraintdef", &[1, 2], DataType::Utf8, none),
        lookup("pg_get_viewdef", &[1, 2], DataType::Utf8, |args, tables| {
            utf8(int(&args[0]).and_then(|oid| tables.view_definition(oid)))
        }),
        function(
            "pg_get_statisticsobjdef_columns",
            &[1],
            DataType::Utf8,
            none,
        ),
        function("pg_get_function_result", &[1], DataType::Utf8, none),
        function("pg_get_function_arguments", &[1], DataType::Utf8, none),
        function(
            "pg_get_function_identity_arguments",
            &[1],
            DataType::Utf8,
            none,
        ),
        function("col_description", &[2], DataType::Utf8, none),
        function("obj_description", &[1, 2], DataType::Utf8, none),
        function("shobj_description", &[2], DataType::Utf8, none),
        // Sizes sluice does not know (DataFusion keeps no per-table size): NULL, which psql's
        // `\dt+` prints as empty.
        function("pg_table_size", &[1], DataType::Int64, |_| {
            ScalarValue::Int64(None)
        }),
        function("pg_relation_size", &[1, 2], DataType::Int64, |_| {
            ScalarValue::Int64(None)
        }),
        function("pg_total_relation_size", &[1], DataType::Int64, |_| {
            ScalarValue::Int64(None)
        }),
        function("pg_size_pretty", &[1], DataType::Utf8, |args| {
            utf8(int(&args[0]).map(size_pretty))
        }),
        function(
            "pg_relation_is_publishable",
            &[1],
            DataType::Boolean,
            |_| ScalarValue::Boolean(Some(false)),
        ),
        function("pg_is_in_recovery", &[0], DataType::Boolean, |_| {
            ScalarValue::Boolean(Some(false))
        }),
        function("pg_encoding_to_char", &[1], DataType::Utf8, |args| {
            utf8(int(&args[0]).map(|e| if e == 6 { "UTF8" } else { "" }.to_string()))
        }),
        function("has_table_privilege", &[2, 3], DataType::Boolean, yes),
        function("has_schema_privilege", &[2, 3], DataType::Boolean, yes),
        function("has_database_privilege", &[2, 3], DataType::Boolean, yes),
        function("has_column_privilege", &[3, 4], DataType::Boolean, yes),
        function("has_function_privilege", &[2, 3], DataType::Boolean, yes),
        function("quote_ident", &[1], DataType::Utf8, |args| {
            utf8(text(&args[0]).map(|s| {
                let plain = s
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
                    && s.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
                if plain {
                    s
                } else {
                    format!("\"{}\"", s.replace('"', "\"\""))
                }
            }))
        }),
        function("array_upper", &[2], DataType::Int32, |args| {
            let len = match &args[0] {
                ScalarValue::List(l) if !l.is_null(0) => Some(l.value(0).len() as i32),
                _ => None,
            };
            ScalarValue::Int32(len.filter(|n| *n > 0 && int(&args[1]) == Some(1)))
        }),
        // `oid::regclass`: the table's name (qualified when it is not on the search path).
        lookup("regclass", &[1], DataType::Utf8, |args, tables| {
            utf8(int(&args[0]).map(|oid| match tables.relation(oid) {
                Some((schema, table)) if SEARCH_PATH.contains(&schema) => table.to_string(),
                Some((schema, table)) => format!("{schema}.{table}"),
                None => oid.to_string(),
            }))
        }),
        // `'name'::regclass`, `to_regclass('name')`: the table's oid, NULL if there is none.
        lookup("to_regclass", &[1], DataType::UInt32, |args, tables| {
            ScalarValue::UInt32(text(&args[0]).and_then(|name| {
                let (schema, table) = match name.split_once('.') {
                    Some((s, t)) => (Some(s.to_string()), t.to_string()),
                    None => (None, name),
                };
                let oids = |s: &str| relation_oid(s, &table);
                match schema {
                    Some(s) => tables.schema_of(oids(&s)).map(|_| oids(&s)),
                    None => SEARCH_PATH
                        .iter()
                        .map(|s| oids(s))
                        .find(|oid| tables.schema_of(*oid).is_some()),
                }
                .map(|oid| oid as u32)
            }))
        }),
        function("regtype", &[1], DataType::Utf8, |args| {
            utf8(int(&args[0]).map(|oid| format_type(oid, None).unwrap_or_else(|| oid.to_string())))
        }),
        // `to_regtype('integer')`: the type's oid by either of its names, NULL if none.
        function("to_regtype", &[1], DataType::UInt32, |args| {
            ScalarValue::UInt32(text(&args[0]).and_then(|name| {
                let name = name.trim().to_ascii_lowercase();
                TYPES
                    .iter()
                    .find(|t| t.name == name || t.sql == name)
                    .map(|t| t.oid as u32)
            }))
        }),
        // `'pg_catalog.array_in'::regproc`: a function by its name, as `pg_type` names the
        // I/O functions (unqualified; sluice's functions are all in `pg_catalog`).
        function("regproc", &[1], DataType::Utf8, |args| {
            utf8(text(&args[0]).map(|name| match name.rsplit_once('.') {
                Some((_, name)) => name.to_string(),
                None => name,
            }))
        }),
        function("regnamespace", &[1], DataType::Utf8, |args| {
            utf8(int(&args[0]).map(|oid| oid.to_string()))
        }),
    ];
    all.into_iter()
        .map(|f| PgFunction {
            catalogs: catalogs.clone(),
            ..f
        })
        .collect()
}

/// `pg_size_pretty`: Postgres's rounding (bytes below 10 kB, then kB, MB, … each below
/// 10240 of its unit, rounded half up).
fn size_pretty(bytes: i64) -> String {
    let mut size = bytes;
    if size.abs() < 10 * 1024 {
        return format!("{size} bytes");
    }
    for unit in ["kB", "MB", "GB", "TB"] {
        let rounded = (size + if size < 0 { -512 } else { 512 }) / 1024;
        if rounded.abs() < 10 * 1024 || unit == "TB" {
            return format!("{rounded} {unit}");
        }
        size /= 1024;
    }
    unreachable!("TB ends the loop")
}

// ---------------------------------------------------------------------------------------------
// Rewrites

/// Rewrites what Postgres clients' catalog queries say in ways DataFusion does not read:
/// `OPERATOR(pg_catalog.op)`, `COLLATE …`, `pg_catalog.`-qualified function names, casts to
/// `pg_catalog.` types and to `regclass`/`regtype`, and unqualified `pg_catalog` table names
/// (Postgres searches `pg_catalog` first).
pub(crate) fn postgres_catalog(statement: &mut datafusion::sql::sqlparser::ast::Statement) {
    use datafusion::sql::sqlparser::ast::{
        BinaryOperator, DataType as T, Expr as E, FunctionArg, FunctionArgExpr,
        FunctionArgumentList, FunctionArguments, Ident, ObjectName, ObjectNamePart, TableFactor,
        VisitMut, VisitorMut,
    };
    use std::ops::ControlFlow;

    fn unqualified(name: &mut ObjectName) {
        if name.0.len() == 2
            && name.0[0]
                .as_ident()
                .is_some_and(|i| i.value.eq_ignore_ascii_case("pg_catalog"))
        {
            name.0.remove(0);
        }
    }
    fn last(name: &ObjectName) -> String {
        name.0
            .last()
            .and_then(|p| p.as_ident())
            .map(|i| i.value.to_ascii_lowercase())
            .unwrap_or_default()
    }
    /// A Postgres type name DataFusion knows by another name, or a reg* type (a function).
    enum Target {
        Type(T),
        Function(&'static str),
    }
    fn target(name: &str) -> Option<Target> {
        Some(match name {
            "text" | "name" | "char" | "bpchar" | "varchar" => Target::Type(T::Text),
            "int2" | "smallint" => Target::Type(T::SmallInt(None)),
            "int4" | "integer" | "int" => Target::Type(T::Int(None)),
            "int8" | "bigint" | "oid" | "xid" => Target::Type(T::BigInt(None)),
            "bool" | "boolean" => Target::Type(T::Boolean),
            "float4" | "real" => Target::Type(T::Real),
            "float8" => Target::Type(T::DoublePrecision),
            "regclass" => Target::Function("regclass"),
            "regtype" => Target::Function("regtype"),
            "regnamespace" => Target::Function("regnamespace"),
            "regproc" | "regprocedure" => Target::Function("regproc"),
            "regrole" => Target::Function("regnamespace"),
            _ => return None,
        })
    }
    fn retype(data_type: &mut T) -> Option<&'static str> {
        match data_type {
            T::Regclass => Some("regclass"),
            T::Custom(name, _) => match target(&last(name))? {
                Target::Type(t) => {
                    *data_type = t;
                    None
                }
                Target::Function(f) => Some(f),
            },
            T::Array(datafusion::sql::sqlparser::ast::ArrayElemTypeDef::SquareBracket(
                inner,
                _,
            ))
            | T::Array(datafusion::sql::sqlparser::ast::ArrayElemTypeDef::AngleBracket(inner)) => {
                retype(inner);
                None
            }
            _ => None,
        }
    }

    const AGGREGATES: &[&str] = &[
        "max",
        "min",
        "count",
        "sum",
        "avg",
        "string_agg",
        "array_agg",
        "bool_and",
        "bool_or",
    ];
    /// `query` with its one select item `e` as `aggregate(e ORDER BY <its ORDER BY>)`, when
    /// it is a plain select of one unaggregated item.
    fn aggregated(
        query: &datafusion::sql::sqlparser::ast::Query,
        aggregate: &str,
    ) -> Option<datafusion::sql::sqlparser::ast::Query> {
        use datafusion::sql::sqlparser::ast::{
            FunctionArgumentClause, GroupByExpr, OrderByKind, SelectItem, SetExpr, Value,
        };
        let SetExpr::Select(select) = query.body.as_ref() else {
            return None;
        };
        let no_groups = matches!(&select.group_by, GroupByExpr::Expressions(g, _) if g.is_empty());
        if select.projection.len() != 1
            || !no_groups
            || select.having.is_some()
            || query.limit_clause.is_some()
        {
            return None;
        }
        let (item, alias) = match &select.projection[0] {
            SelectItem::UnnamedExpr(e) => (e.clone(), None),
            SelectItem::ExprWithAlias { expr, alias } => (expr.clone(), Some(alias.clone())),
            _ => return None,
        };
        if let E::Function(f) = &item {
            if AGGREGATES.contains(&last(&f.name).as_str()) {
                return None;
            }
        }
        let mut order = Vec::new();
        if let Some(by) = &query.order_by {
            let OrderByKind::Expressions(exprs) = &by.kind else {
                return None;
            };
            for e in exprs {
                let mut e = e.clone();
                // `ORDER BY 1` names the select item.
                if matches!(&e.expr, E::Value(v) if matches!(&v.value, Value::Number(n, _) if n == "1"))
                {
                    e.expr = item.clone();
                }
                order.push(e);
            }
        }
        let call = E::Function(datafusion::sql::sqlparser::ast::Function {
            name: ObjectName::from(vec![Ident::new(aggregate)]),
            uses_odbc_syntax: false,
            parameters: FunctionArguments::None,
            args: FunctionArguments::List(FunctionArgumentList {
                duplicate_treatment: None,
                args: vec![FunctionArg::Unnamed(FunctionArgExpr::Expr(item))],
                clauses: if order.is_empty() {
                    vec![]
                } else {
                    vec![FunctionArgumentClause::OrderBy(order)]
                },
            }),
            filter: None,
            null_treatment: None,
            over: None,
            within_group: vec![],
        });
        let mut select = select.clone();
        select.projection = vec![match alias {
            Some(alias) => SelectItem::ExprWithAlias { expr: call, alias },
            None => SelectItem::UnnamedExpr(call),
        }];
        let mut query = query.clone();
        query.body = Box::new(SetExpr::Select(select));
        query.order_by = None;
        Some(query)
    }
    /// Whether every table `query` reads directly is one of `pg_catalog`'s.
    fn reads_catalog_only(query: &datafusion::sql::sqlparser::ast::Query) -> bool {
        use datafusion::sql::sqlparser::ast::SetExpr;
        let SetExpr::Select(select) = query.body.as_ref() else {
            return false;
        };
        let catalog = |factor: &TableFactor| match factor {
            TableFactor::Table {
                name, args: None, ..
            } => {
                name.0.len() == 2
                    && name.0[0]
                        .as_ident()
                        .is_some_and(|i| i.value.eq_ignore_ascii_case("pg_catalog"))
            }
            _ => false,
        };
        !select.from.is_empty()
            && select
                .from
                .iter()
                .all(|t| catalog(&t.relation) && t.joins.iter().all(|j| catalog(&j.relation)))
    }

    /// Whether a relation is one of the tables sluice never has a row for, or a subquery
    /// over one (JDBC's primary keys: a select over a select joining `pg_index`).
    fn always_empty(factor: &TableFactor) -> bool {
        match factor {
            TableFactor::Table {
                name, args: None, ..
            } => {
                name.0.len() == 2
                    && ALWAYS_EMPTY.contains(&last(name).as_str())
                    && name.0[0]
                        .as_ident()
                        .is_some_and(|i| i.value.eq_ignore_ascii_case("pg_catalog"))
            }
            TableFactor::Derived {
                lateral: false,
                subquery,
                ..
            } => has_no_rows(subquery),
            _ => false,
        }
    }
    /// Whether a select reads (not outer-joined) a table sluice never has a row for.
    fn select_has_no_rows(select: &datafusion::sql::sqlparser::ast::Select) -> bool {
        use datafusion::sql::sqlparser::ast::JoinOperator as J;
        select.from.iter().any(|t| {
            always_empty(&t.relation)
                || t.joins.iter().any(|j| {
                    matches!(j.join_operator, J::Join(_) | J::Inner(_) | J::CrossJoin(_))
                        && always_empty(&j.relation)
                })
        })
    }
    fn has_no_rows(query: &datafusion::sql::sqlparser::ast::Query) -> bool {
        matches!(query.body.as_ref(), datafusion::sql::sqlparser::ast::SetExpr::Select(s) if select_has_no_rows(s))
    }
    /// Whether a query's rows come from `unnest` of an outer row's value.
    fn unnests_outer_array(query: &datafusion::sql::sqlparser::ast::Query) -> bool {
        let datafusion::sql::sqlparser::ast::SetExpr::Select(select) = query.body.as_ref() else {
            return false;
        };
        select.from.iter().any(|t| match &t.relation {
            TableFactor::Table {
                name,
                args: Some(args),
                ..
            } => {
                last(name) == "unnest"
                    && args.args.iter().any(|a| {
                        matches!(
                            a,
                            FunctionArg::Unnamed(FunctionArgExpr::Expr(E::CompoundIdentifier(_)))
                        )
                    })
            }
            TableFactor::UNNEST { array_exprs, .. } => array_exprs
                .iter()
                .any(|e| matches!(e, E::CompoundIdentifier(_))),
            _ => false,
        })
    }

    struct Rewrite;
    impl VisitorMut for Rewrite {
        type Break = ();
        fn post_visit_query(
            &mut self,
            query: &mut datafusion::sql::sqlparser::ast::Query,
        ) -> ControlFlow<()> {
            use datafusion::sql::sqlparser::ast::{SelectItem, SetExpr, Value};
            fn selects(
                body: &mut SetExpr,
                each: &mut dyn FnMut(&mut datafusion::sql::sqlparser::ast::Select),
            ) {
                match body {
                    SetExpr::Select(s) => each(s),
                    SetExpr::SetOperation { left, right, .. } => {
                        selects(left, each);
                        selects(right, each);
                    }
                    _ => {}
                }
            }
            selects(query.body.as_mut(), &mut |select| {
                // A select with no rows: what it would compute is never computed, so each
                // computed item is NULL (named as Postgres names it) and its filter goes,
                // which spares DataFusion planning what it cannot (correlated subqueries,
                // array literals compared with arrays of other types).
                if select_has_no_rows(select) {
                    for item in select.projection.iter_mut() {
                        if let SelectItem::UnnamedExpr(e) = item {
                            if let Some(name) = crate::compat::postgres_name(e) {
                                *item = SelectItem::ExprWithAlias {
                                    expr: E::value(Value::Null),
                                    alias: Ident::with_quote('"', name),
                                };
                            }
                        } else if let SelectItem::ExprWithAlias { expr, .. } = item {
                            if !matches!(expr, E::Identifier(_) | E::CompoundIdentifier(_)) {
                                *expr = E::value(Value::Null);
                            }
                        }
                    }
                    select.selection = None;
                }
                // Postgres lets unaliased items share a name (`SELECT NULL, NULL`);
                // DataFusion does not, so the second and later get one of their own.
                let mut seen = std::collections::HashSet::new();
                for (i, item) in select.projection.iter_mut().enumerate() {
                    match item {
                        SelectItem::UnnamedExpr(e) if !seen.insert(e.to_string()) => {
                            let name = crate::compat::postgres_name(e).unwrap_or_default();
                            *item = SelectItem::ExprWithAlias {
                                expr: e.clone(),
                                alias: Ident::with_quote('"', format!("{name}_{i}")),
                            };
                        }
                        SelectItem::ExprWithAlias { alias, .. }
                            if !seen.insert(alias.value.clone()) =>
                        {
                            *alias = Ident::with_quote('"', format!("{}_{i}", alias.value));
                        }
                        _ => {}
                    }
                }
            });
            ControlFlow::Continue(())
        }
        fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
            if let TableFactor::Table { name, args, .. } = factor {
                if args.is_some() {
                    unqualified(name);
                } else if name.0.len() == 1 && is_catalog_table(&last(name)) {
                    name.0
                        .insert(0, ObjectNamePart::Identifier(Ident::new("pg_catalog")));
                }
            }
            ControlFlow::Continue(())
        }
        fn post_visit_expr(&mut self, expr: &mut E) -> ControlFlow<()> {
            match expr {
                E::BinaryOp { op, .. } => {
                    if let BinaryOperator::PGCustomBinaryOperator(parts) = op {
                        if let [schema, symbol] = parts.as_slice() {
                            if schema.eq_ignore_ascii_case("pg_catalog") {
                                let plain = match symbol.as_str() {
                                    "~" => Some(BinaryOperator::PGRegexMatch),
                                    "~*" => Some(BinaryOperator::PGRegexIMatch),
                                    "!~" => Some(BinaryOperator::PGRegexNotMatch),
                                    "!~*" => Some(BinaryOperator::PGRegexNotIMatch),
                                    "~~" => Some(BinaryOperator::PGLikeMatch),
                                    "=" => Some(BinaryOperator::Eq),
                                    "<>" => Some(BinaryOperator::NotEq),
                                    "<" => Some(BinaryOperator::Lt),
                                    "<=" => Some(BinaryOperator::LtEq),
                                    ">" => Some(BinaryOperator::Gt),
                                    ">=" => Some(BinaryOperator::GtEq),
                                    "||" => Some(BinaryOperator::StringConcat),
                                    _ => None,
                                };
                                if let Some(plain) = plain {
                                    *op = plain;
                                }
                            }
                        }
                    }
                }
                E::Collate { expr: inner, .. } => {
                    *expr = std::mem::replace(
                        inner.as_mut(),
                        E::value(datafusion::sql::sqlparser::ast::Value::Null),
                    );
                }
                E::Function(f) => {
                    unqualified(&mut f.name);
                    // `ARRAY(SELECT e FROM … ORDER BY …)`: the subquery's rows as one array,
                    // which is `(SELECT array_agg(e ORDER BY …) FROM …)`.
                    if last(&f.name) == "array" {
                        if let FunctionArguments::Subquery(query) = &f.args {
                            if unnests_outer_array(query) {
                                // `ARRAY(SELECT 'toast.' || x FROM unnest(tc.reloptions) x)`:
                                // DataFusion cannot run a subquery over an outer row's
                                // array, and the arrays clients unnest so (reloptions) are
                                // always NULL in sluice's catalog.
                                *expr = E::value(datafusion::sql::sqlparser::ast::Value::Null);
                            } else if let Some(aggregated) = aggregated(query, "array_agg") {
                                // ARRAY() of no rows is `{}`; array_agg of none is NULL.
                                let call = |name: &str, args: Vec<E>| {
                                    E::Function(datafusion::sql::sqlparser::ast::Function {
                                        name: ObjectName::from(vec![Ident::new(name)]),
                                        uses_odbc_syntax: false,
                                        parameters: FunctionArguments::None,
                                        args: FunctionArguments::List(FunctionArgumentList {
                                            duplicate_treatment: None,
                                            args: args
                                                .into_iter()
                                                .map(|a| {
                                                    FunctionArg::Unnamed(FunctionArgExpr::Expr(a))
                                                })
                                                .collect(),
                                            clauses: vec![],
                                        }),
                                        filter: None,
                                        null_treatment: None,
                                        over: None,
                                        within_group: vec![],
                                    })
                                };
                                *expr = call(
                                    "coalesce",
                                    vec![
                                        E::Subquery(Box::new(aggregated)),
                                        call("make_array", vec![]),
                                    ],
                                );
                            }
                        }
                    }
                }
                // A subquery that reads a table sluice never has a row for finds nothing.
                E::Subquery(query) if has_no_rows(query) => {
                    *expr = E::value(datafusion::sql::sqlparser::ast::Value::Null);
                }
                // A scalar subquery over the catalog, unaggregated (`(SELECT pg_get_expr(…)
                // FROM pg_attrdef d WHERE d.adrelid = a.attrelid …)`): Postgres requires it
                // to find at most one row, and DataFusion wants that said with an aggregate
                // to decorrelate it. `max` of at most one row is that row.
                E::Subquery(query) if reads_catalog_only(query) => {
                    if let Some(aggregated) = aggregated(query, "max") {
                        **query = aggregated;
                    }
                }
                E::Cast {
                    expr: inner,
                    data_type,
                    ..
                } => {
                    if let Some(mut function) = retype(data_type) {
                        // A name cast to regclass is the table's oid (`'t'::regclass`).
                        if function == "regclass"
                            && matches!(inner.as_ref(), E::Value(v) if matches!(v.value, datafusion::sql::sqlparser::ast::Value::SingleQuotedString(_)))
                        {
                            function = "to_regclass";
                        }
                        let argument = std::mem::replace(
                            inner.as_mut(),
                            E::value(datafusion::sql::sqlparser::ast::Value::Null),
                        );
                        *expr = E::Function(datafusion::sql::sqlparser::ast::Function {
                            name: ObjectName::from(vec![Ident::new(function)]),
                            uses_odbc_syntax: false,
                            parameters: FunctionArguments::None,
                            args: FunctionArguments::List(FunctionArgumentList {
                                duplicate_treatment: None,
                                args: vec![FunctionArg::Unnamed(FunctionArgExpr::Expr(argument))],
                                clauses: vec![],
                            }),
                            filter: None,
                            null_treatment: None,
                            over: None,
                            within_group: vec![],
                        });
                    }
                }
                _ => {}
            }
            ControlFlow::Continue(())
        }
    }
    let _ = statement.visit(&mut Rewrite);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_as_postgres_prints_them() {
        // pg_size_pretty's answers in PostgreSQL 15.
        for (bytes, pretty) in [
            (0, "0 bytes"),
            (10_239, "10239 bytes"),
            (10_240, "10 kB"),
            (1_000_000, "977 kB"),
            (10_485_760, "10 MB"),
        ] {
            assert_eq!(size_pretty(bytes), pretty);
        }
    }

    #[test]
    fn type_names_are_postgres_sql_names() {
        assert_eq!(format_type(23, None).as_deref(), Some("integer"));
        assert_eq!(
            format_type(1700, Some(type_modifier(&DataType::Decimal128(10, 2)))).as_deref(),
            Some("numeric(10,2)")
        );
        assert_eq!(type_oid(&DataType::UInt32), 26);
    }
}
