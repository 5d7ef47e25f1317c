//! What the plan tests share: a migrated database populated for a plan to
//! choose among, a connection to it on which the store's statements are
//! prepared and explained, and the walk over the plan PostgreSQL chose.

use std::collections::BTreeMap;

use serde_json::Value;
use sqlx::{Connection, PgConnection, Row};
use tollgate_pg::testing::{TestDb, store_statements};

/// A populated database and one connection to it, on which the store's
/// statements are prepared by name.
pub(crate) struct Planner {
    db: TestDb,
    pub conn: PgConnection,
    /// The store's statements by constant name.
    pub statements: BTreeMap<&'static str, &'static str>,
}

impl Planner {
    /// A migrated database of its own holding `populate`, and a connection to
    /// it.
    pub(crate) async fn start(populate: &'static str) -> Planner {
        let db = TestDb::create_migrated().await;
        sqlx::raw_sql(populate).execute(db.pool()).await.expect("populate");
        let conn = PgConnection::connect_with(&db.connect_options()).await.expect("connection");
        Planner { db, conn, statements: store_statements().iter().copied().collect() }
    }

    /// `force_generic_plan` plans a prepared statement as the pool's
    /// connections do after a few executions; `force_custom_plan` for its
    /// values.
    pub(crate) async fn plan_cache_mode(&mut self, mode: &str) {
        let set = format!("SET plan_cache_mode = {mode}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(set)).execute(&mut self.conn).await.expect("plan mode");
    }

    /// Prepares the store's statement `name` as `prepared` with parameters of
    /// `types`, and returns the plan of executing it with `values` (both
    /// comma-separated SQL lists).
    pub(crate) async fn explain(&mut self, prepared: &str, name: &str, types: &str, values: &str) -> Value {
        let prepare = format!("PREPARE {prepared} ({types}) AS {}", self.statements[name]);
        sqlx::raw_sql(sqlx::AssertSqlSafe(prepare)).execute(&mut self.conn).await.expect("prepare");
        let explain = format!("EXPLAIN (FORMAT JSON) EXECUTE {prepared} ({values})");
        let row = sqlx::raw_sql(sqlx::AssertSqlSafe(explain)).fetch_one(&mut self.conn).await.expect("explain");
        let text = row.try_get_raw(0).expect("plan").as_str().expect("plan text").to_owned();
        serde_json::from_str(&text).expect("plan JSON")
    }

    pub(crate) async fn finish(self) {
        drop(self.conn);
        self.db.drop_now().await;
    }
}

/// Every node of an `EXPLAIN (FORMAT JSON)` plan, depth first from its root.
pub(crate) fn plan_nodes(explained: &Value) -> Vec<&Value> {
    fn walk<'a>(node: &'a Value, out: &mut Vec<&'a Value>) {
        out.push(node);
        for child in node["Plans"].as_array().into_iter().flatten() {
            walk(child, out);
        }
    }
    let mut nodes = Vec::new();
    walk(&explained[0]["Plan"], &mut nodes);
    nodes
}

/// The values of `field` (such as `Index Name`) across the plan's nodes, in
/// plan order, skipping the nodes without it.
pub(crate) fn plan_field<'a>(explained: &'a Value, field: &str) -> Vec<&'a str> {
    plan_nodes(explained).into_iter().filter_map(|node| node[field].as_str()).collect()
}
