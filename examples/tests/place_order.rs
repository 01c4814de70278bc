//! The place_order server (`examples/place_order.rs`, `#[idempotent(transactional)]`) as a child
//! process over stdio, driven by rmcp's client, on a SQLite file and on PostgreSQL: it lists
//! `place_order` as idempotent, places an order once, replays the repeat (also from a second
//! process on the same database), refuses bad arguments without writing or storing anything, and
//! the `orders` table, read at the far side through a connection of its own, has exactly one row
//! for the order, written under the call's reference.

use idempotency::error::STATUS_TOOL;
use idempotency::mcp::{META_REF, META_REPLAYED, META_STATUS};
use rmcp::model::CallToolResult;
use rmcp::ServiceExt;
use serde_json::{json, Value};

use crate::common::pg::Schema;
use crate::common::{call, remove_db, temp_db, Client};

const SECRET: &str = "place-order-test-secret-0123456789";

/// Where the server keeps its records and the `orders` table.
enum Place {
    /// A SQLite file.
    Sqlite(std::path::PathBuf),
    /// A PostgreSQL schema of this test: `url` is `DATABASE_URL` with its `search_path`.
    Postgres { url: String, _schema: Schema },
}

impl Place {
    /// The server on this database, as a command (the caller `tenant`/`alice`).
    fn server(&self, tenant: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_place_order"));
        cmd.env("IDEMPOTENCY_SECRET", SECRET)
            .env("IDEMPOTENCY_TENANT", tenant)
            .env("IDEMPOTENCY_SUBJECT", "alice")
            .env_remove("IDEMPOTENCY_SQLITE")
            .env_remove("IDEMPOTENCY_WAIT")
            .env("RUST_LOG", "warn");
        match self {
            Place::Sqlite(path) => cmd
                .env("IDEMPOTENCY_SQLITE", path)
                .env_remove("DATABASE_URL"),
            Place::Postgres { url, .. } => cmd.env("DATABASE_URL", url),
        };
        cmd
    }

    async fn connect(&self, tenant: &str) -> Client {
        let transport =
            rmcp::transport::TokioChildProcess::new(self.server(tenant)).expect("spawn the server");
        ().serve(transport)
            .await
            .expect("the server answers initialize")
    }

    /// The far side: the `orders` table through a connection of its own.
    async fn far(&self) -> Far {
        match self {
            Place::Sqlite(path) => {
                let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
                Far::Sqlite(sqlx::SqlitePool::connect_with(options).await.expect("open"))
            }
            Place::Postgres { url, .. } => {
                Far::Postgres(sqlx::PgPool::connect(url).await.expect("connect"))
            }
        }
    }
}

enum Far {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Far {
    /// The rows of `tenant`'s `order_id`: (reference, amount_cents).
    async fn rows(&self, tenant: &str, order_id: &str) -> Vec<(String, i64)> {
        let sql = "SELECT reference, amount_cents FROM orders WHERE tenant = $1 AND order_id = $2";
        match self {
            Far::Sqlite(p) => {
                sqlx::query_as(sql)
                    .bind(tenant)
                    .bind(order_id)
                    .fetch_all(p)
                    .await
            }
            Far::Postgres(p) => {
                sqlx::query_as(sql)
                    .bind(tenant)
                    .bind(order_id)
                    .fetch_all(p)
                    .await
            }
        }
        .expect("read the orders table")
    }

    async fn close(self) {
        match self {
            Far::Sqlite(p) => p.close().await,
            Far::Postgres(p) => p.close().await,
        }
    }
}

fn meta<'a>(r: &'a CallToolResult, key: &str) -> Option<&'a Value> {
    r.meta.as_ref()?.0.get(key)
}

fn replayed(r: &CallToolResult) -> bool {
    meta(r, META_REPLAYED) == Some(&Value::Bool(true))
}

fn structured(r: &CallToolResult) -> Value {
    r.structured_content.clone().unwrap_or(Value::Null)
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn order() -> Value {
    json!({
        "order_id": "o-1001",
        "items": [
            {"sku": "mug", "quantity": 2, "unit_cents": 1250},
            {"sku": "tea", "quantity": 1, "unit_cents": 800}
        ],
        "currency": "EUR"
    })
}

/// Every step, on one database.
async fn places_once_and_replays(place: Place) {
    let client = place.connect("acme").await;
    // After `initialize`: the server has created the table.
    let far = place.far().await;

    let tools = client.list_all_tools().await.expect("tools/list");
    let hint = |name: &str| {
        let tool = tools.iter().find(|t| t.name == name);
        let tool = tool.unwrap_or_else(|| panic!("{name} is listed"));
        tool.annotations.as_ref().and_then(|a| a.idempotent_hint)
    };
    assert_eq!(hint("place_order"), Some(true), "the wrapped tool says so");
    assert_ne!(hint(STATUS_TOOL), Some(false), "the status tool is listed");

    // Bad arguments: refused before any write, and not stored (the same call is checked again).
    let mut bad = order();
    bad["currency"] = json!("XYZ");
    let refused = call(&client, "place_order", bad.clone()).await;
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    assert!(
        text(&refused).contains("unknown currency"),
        "{}",
        text(&refused)
    );
    assert_eq!(
        meta(&refused, META_STATUS),
        None,
        "the handler's own refusal"
    );
    let refused_again = call(&client, "place_order", bad).await;
    assert_eq!(refused_again.is_error, Some(true));
    assert!(!replayed(&refused_again), "a refusal is not replayed");
    assert!(
        far.rows("acme", "o-1001").await.is_empty(),
        "nothing was written"
    );

    // The order: placed once, under the call's reference.
    let first = call(&client, "place_order", order()).await;
    assert_eq!(first.is_error, Some(false), "{}", text(&first));
    assert!(!replayed(&first));
    let reference = meta(&first, META_REF)
        .and_then(Value::as_str)
        .expect("the answer names its ref")
        .to_owned();
    let placed = structured(&first);
    assert_eq!(placed["order_id"], "o-1001", "{placed}");
    assert_eq!(placed["amount_cents"], 3300, "{placed}");
    assert_eq!(placed["currency"], "EUR", "{placed}");
    assert_eq!(placed["items"], order()["items"], "{placed}");
    assert_eq!(placed["reference"], reference.as_str(), "{placed}");

    // The repeat: replayed, the same answer, no second row.
    let repeat = call(&client, "place_order", order()).await;
    assert!(replayed(&repeat), "{}", text(&repeat));
    assert_eq!(repeat.content, first.content);
    assert_eq!(structured(&repeat), placed);
    assert_eq!(
        far.rows("acme", "o-1001").await,
        vec![(reference.clone(), 3300)],
        "exactly one row, written by the call"
    );

    // The same order id with other items is another call's key: a payload mismatch.
    let mut other = order();
    other["items"][0]["quantity"] = json!(3);
    let mismatch = call(&client, "place_order", other).await;
    assert_eq!(mismatch.is_error, Some(true));
    assert_eq!(
        meta(&mismatch, META_STATUS).and_then(Value::as_str),
        Some("payload_mismatch")
    );

    let status = call(&client, STATUS_TOOL, json!({ "ref": reference })).await;
    assert_eq!(status.is_error, Some(false), "{status:?}");
    let status = structured(&status);
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(status["answer"], placed, "the status tool shows the order");
    client.cancel().await.expect("the client closes");

    // A second process on the same database: the record and the order survived; still a replay.
    let client = place.connect("acme").await;
    let later = call(&client, "place_order", order()).await;
    assert!(replayed(&later), "{}", text(&later));
    assert_eq!(later.content, first.content);
    assert_eq!(structured(&later), placed);
    client.cancel().await.expect("the client closes");

    // Another tenant's call for the same order id is a call and an order of its own: it runs
    // and places globex's order, leaving acme's as it was.
    let client = place.connect("globex").await;
    let theirs = call(&client, "place_order", order()).await;
    assert_eq!(theirs.is_error, Some(false), "{}", text(&theirs));
    assert!(!replayed(&theirs), "{}", text(&theirs));
    let their_ref = structured(&theirs)["reference"]
        .as_str()
        .expect("globex's order names its reference")
        .to_owned();
    assert_ne!(their_ref, reference);
    client.cancel().await.expect("the client closes");

    assert_eq!(far.rows("acme", "o-1001").await, vec![(reference, 3300)]);
    assert_eq!(far.rows("globex", "o-1001").await, vec![(their_ref, 3300)]);
    far.close().await;
}

#[tokio::test]
async fn on_a_sqlite_file() {
    let db = temp_db("place-order");
    places_once_and_replays(Place::Sqlite(db.clone())).await;
    remove_db(&db);
}

#[tokio::test]
#[cfg_attr(no_database, ignore = "needs DATABASE_URL (PostgreSQL)")]
async fn on_postgres() {
    let url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .expect(
            "DATABASE_URL is not set: this PostgreSQL test runs only with a database \
             (it is ignored when the tests are built without DATABASE_URL)",
        );
    let schema = Schema::create(&url, "place_order").await;
    let url = schema.url();
    places_once_and_replays(Place::Postgres {
        url,
        _schema: schema,
    })
    .await;
}
