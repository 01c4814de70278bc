//! `idempotency-admin`: what an operator needs without SQL — look a record up, list the claims
//! waiting for reconciliation, settle one by hand (fenced like the reconciler), purge, count, and
//! migrate. Against `sqlite:PATH`, `postgres://…`, `redis://HOST:PORT[/DB]` or
//! `redis+cluster://HOST:PORT,HOST:PORT` (seed nodes of a Redis Cluster); `--json` for scripts.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use idempotency::store::{Fenced, RecordState, Settlement, StoreError, StoredResponse};
use idempotency::Reference;
use serde_json::{json, Value};

mod db;

use db::{Db, Mode, RedisOptions};

/// Look inside an idempotency store, settle, purge and migrate it.
#[derive(Parser)]
#[command(
    name = "idempotency-admin",
    version,
    after_help = "Exit status: 0 found or done; 1 an error (the store cannot be opened, a refusal); \
                  2 a usage error (also a reference that does not parse); 3 not found (no \
                  idempotency store at the place given; inspect or settle of a reference with no \
                  record). Only `migrate` creates a store. With --json, an error is also a JSON \
                  object on stdout: {\"error\":{\"kind\":…,\"message\":…,\"exit\":N}}."
)]
struct Args {
    /// The store: `sqlite:PATH`, a PostgreSQL URL (`postgres://…`), one Redis
    /// (`redis://HOST:PORT[/DB]`) or a Redis Cluster by seed nodes
    /// (`redis+cluster://HOST:PORT,HOST:PORT`).
    #[arg(long, env = "IDEMPOTENCY_STORE")]
    store: String,
    /// Redis only: the application's key prefix (`RedisStoreBuilder::namespace`).
    #[arg(
        long,
        env = "IDEMPOTENCY_REDIS_NAMESPACE",
        default_value = "idem",
        global = true
    )]
    namespace: String,
    /// Redis only: the application's retention (`RedisStoreBuilder::retention`): a record that
    /// `settle` completes or releases expires this long after its window.
    #[arg(long, value_parser = duration, default_value = "48h", global = true)]
    redis_retention: Duration,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// One record by its reference (any tenant unless --tenant).
    Inspect {
        /// The reference, e.g. 3f9a0c1b2d4e5f60-1.
        reference: String,
        /// Only if it belongs to this tenant.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Claims waiting for reconciliation: in flight past their lease, or outcome unknown.
    Unsettled {
        /// Only claims made at least this long ago (e.g. 10m, 2h).
        #[arg(long, value_parser = duration)]
        older_than: Option<Duration>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Settles an unsettled claim, fenced like the reconciler (a worker that reports late is
    /// refused). A completed answer is replayed for the tool's own window (the one its claim
    /// recorded) from now.
    Settle {
        /// The claim's reference.
        reference: String,
        /// It did happen: the answer a repeat gets, as JSON in this file.
        #[arg(long, group = "how")]
        completed: Option<std::path::PathBuf>,
        /// It did not happen: a repeat may run it.
        #[arg(long, group = "how")]
        released: bool,
        /// Still cannot tell.
        #[arg(long, group = "how")]
        unknown: bool,
        /// SQLite only: settle a claim whose lease ended less than 10 minutes ago by this
        /// machine's clock (SQLite has no server clock to judge by; a worker on a machine whose
        /// clock is behind may still be running it).
        #[arg(long)]
        force: bool,
    },
    /// Deletes completed and released records past their window plus the retention. On Redis
    /// they expire by themselves at window end + the store's retention: this deletes earlier
    /// (a shorter --retention) and trims index entries of expired records (not counted).
    Purge {
        /// How long records are kept after their window.
        #[arg(long, value_parser = duration, default_value = "48h")]
        retention: Duration,
        /// Count what would go, delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Records by state and tool, the oldest claim in flight, the table's size.
    Stats,
    /// Creates the store if there is none and applies the library's migrations (the only
    /// command that creates or changes a schema).
    Migrate,
}

/// `90s`, `15m`, `2h`, `1d`, `500ms`: the attribute's grammar (`window = "15m"`), which the
/// `idempotency-options` holds for both, so a duration reads the same in code and on the command line.
fn duration(s: &str) -> Result<Duration, String> {
    idempotency_options::parse_duration(s).map(Duration::from_millis)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Exit status for a usage error (clap's own too).
const USAGE: u8 = 2;
/// Exit status for "not found": no such record, or no store at the place given.
const NOT_FOUND: u8 = 3;

/// How long after a claim's lease ended, by this machine's clock, `settle` on SQLite still
/// refuses it without `--force`: SQLite has no server clock, and the worker's machine's clock may
/// be behind this one's.
const SQLITE_SETTLE_MARGIN: Duration = Duration::from_secs(10 * 60);

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) => {
            // Help and version go to stdout as usual; a usage error, with --json, is also said
            // in JSON (the flag is global, so it is looked for anywhere on the line).
            if e.use_stderr() && std::env::args().any(|a| a == "--json") {
                let rendered = e.render().to_string();
                let first = rendered.lines().next().unwrap_or_default();
                let message = first.strip_prefix("error: ").unwrap_or(first);
                println!("{}", error_json("usage", message, USAGE));
            }
            e.exit();
        }
    };
    let print = |out: &Output| {
        if args.json {
            println!("{}", out.json);
        } else {
            println!("{}", out.text.trim_end());
        }
    };
    let (kind, message, code) = match run(&args).await {
        Ok(Answer::Done(out)) => {
            print(&out);
            return ExitCode::SUCCESS;
        }
        Ok(Answer::NotFound(out)) => {
            print(&out);
            return ExitCode::from(NOT_FOUND);
        }
        Err(Failed::Usage(message)) => ("usage", message, USAGE),
        Err(Failed::Refused(message)) => ("refused", message, 1),
        Err(Failed::Error(e)) => {
            let (kind, code) = classify(&*e);
            (kind, chain(&*e), code)
        }
    };
    eprintln!("error: {message}");
    if args.json {
        println!("{}", error_json(kind, &message, code));
    }
    ExitCode::from(code)
}

/// `{"error":{"kind":…,"message":…,"exit":N}}`.
fn error_json(kind: &str, message: &str, exit: u8) -> Value {
    json!({"error": {"kind": kind, "message": message, "exit": exit}})
}

/// An error's kind for scripts and its exit status: the store error in its sources, if any.
fn classify(e: &(dyn std::error::Error + 'static)) -> (&'static str, u8) {
    let mut source = Some(e);
    while let Some(err) = source {
        if let Some(store) = err.downcast_ref::<StoreError>() {
            return match store {
                StoreError::NoStore { .. } => ("no_store", NOT_FOUND),
                StoreError::Unavailable(_) => ("unavailable", 1),
                StoreError::Config { .. } => ("config", 1),
                StoreError::Migration { .. } => ("migration", 1),
                StoreError::Corrupt { .. } => ("corrupt", 1),
                StoreError::Fenced { .. } | StoreError::WrongState { .. } => ("refused", 1),
                _ => ("store", 1),
            };
        }
        source = err.source();
    }
    ("error", 1)
}

/// `e` and its sources, joined by ": " (a source some driver's message already ends with, once).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !message.ends_with(&cause_text) {
            message.push_str(": ");
            message.push_str(&cause_text);
        }
        source = cause.source();
    }
    message
}

/// A command's answer, for people and for scripts.
struct Output {
    text: String,
    json: Value,
}

/// What a command found.
enum Answer {
    Done(Output),
    NotFound(Output),
}

/// Why a command did not answer.
enum Failed {
    /// The command line is wrong (exit 2).
    Usage(String),
    /// The command will not do this to this record, and says why (exit 1).
    Refused(String),
    /// Anything else (exit 1).
    Error(BoxError),
}

impl<E: Into<BoxError>> From<E> for Failed {
    fn from(e: E) -> Self {
        Failed::Error(e.into())
    }
}

fn parse_reference(s: &str) -> Result<Reference, Failed> {
    s.parse::<Reference>().map_err(|e| {
        Failed::Usage(format!(
            "{s:?} is not a reference like 3f9a0c1b2d4e5f60-1: {e}"
        ))
    })
}

/// `n` and the noun, singular or plural.
fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

async fn run(args: &Args) -> Result<Answer, Failed> {
    // Check the command line before touching the store.
    let reference = match &args.command {
        Command::Inspect { reference, .. } | Command::Settle { reference, .. } => {
            Some(parse_reference(reference)?)
        }
        _ => None,
    };
    let mode = match &args.command {
        Command::Migrate => Mode::Create,
        Command::Settle { .. } => Mode::Write,
        Command::Purge { dry_run, .. } if !dry_run => Mode::Write,
        Command::Purge { .. }
        | Command::Inspect { .. }
        | Command::Unsettled { .. }
        | Command::Stats => Mode::Read,
    };
    let db = Db::open(
        &args.store,
        RedisOptions {
            namespace: &args.namespace,
            retention: args.redis_retention,
        },
        mode,
    )
    .await?;
    // Records are judged by the store's clock where it has one (PostgreSQL, Redis).
    let (now, clock) = db.clock().await?;
    Ok(Answer::Done(match &args.command {
        Command::Migrate => Output {
            text: match db {
                Db::Redis(_) => {
                    "Redis: no schema to migrate (keys are written as records are; the store's scripts load on first use)".to_owned()
                }
                _ => format!("{}: migrations applied, the schema is current", db.name()),
            },
            json: json!({"migrated": true, "store": db.name()}),
        },
        Command::Inspect { tenant, .. } => {
            let reference = reference.ok_or("no reference")?;
            match db.inspect(reference, tenant.as_deref(), now).await? {
                Some(mut record) => {
                    record["clock"] = json!({"source": clock, "now": now.to_string()});
                    Output {
                        text: db::describe(&record),
                        json: record,
                    }
                }
                None => {
                    return Ok(Answer::NotFound(Output {
                        text: format!("{reference}: not found"),
                        json: json!({"reference": reference.to_string(), "found": false}),
                    }))
                }
            }
        }
        Command::Unsettled { older_than, limit } => {
            let cutoff = older_than.map(|d| now - d);
            let claims = db.admin().unsettled_claims(now, *limit).await?;
            let rows: Vec<Value> = claims
                .iter()
                .filter(|c| cutoff.is_none_or(|t| c.claimed_at <= t))
                .map(|c| {
                    json!({
                        "reference": c.reference.to_string(),
                        "tenant": c.tenant,
                        "subject": c.subject,
                        "tool": c.tool,
                        "state": c.state.as_str(),
                        "claimed_at": c.claimed_at.to_string(),
                    })
                })
                .collect();
            let text = if rows.is_empty() {
                "no unsettled claims".to_owned()
            } else {
                rows.iter()
                    .map(|r| {
                        format!(
                            "{}  {}  {}  {}  claimed {}",
                            r["reference"].as_str().unwrap_or(""),
                            r["state"].as_str().unwrap_or(""),
                            r["tenant"].as_str().unwrap_or(""),
                            r["tool"].as_str().unwrap_or(""),
                            r["claimed_at"].as_str().unwrap_or("")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            Output {
                text,
                json: Value::Array(rows),
            }
        }
        Command::Settle {
            completed,
            released,
            unknown,
            force,
            ..
        } => {
            let reference = reference.ok_or("no reference")?;
            let settlement = match (completed, released, unknown) {
                (Some(file), false, false) => {
                    let body = std::fs::read_to_string(file)
                        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
                    serde_json::from_str::<Value>(&body)
                        .map_err(|e| format!("{} is not JSON: {e}", file.display()))?;
                    Settlement::Completed(StoredResponse { ok: true, body })
                }
                (None, true, false) => Settlement::Released,
                (None, false, true) => Settlement::Unknown,
                _ => {
                    return Err(Failed::Usage(
                        "say how it settled: --completed FILE, --released or --unknown".into(),
                    ))
                }
            };
            // The claim and the token to present, as the reconciler would see them.
            let claims = db.admin().unsettled_claims(now, u32::MAX).await?;
            let Some(claim) = claims.iter().find(|c| c.reference == reference) else {
                if db.inspect(reference, None, now).await?.is_none() {
                    return Ok(Answer::NotFound(Output {
                        text: format!("{reference}: not found; nothing settled"),
                        json: json!({"reference": reference.to_string(), "found": false}),
                    }));
                }
                return Err(format!("{reference} is not an unsettled claim (in flight past its lease, or unknown): nothing settled").into());
            };
            if db.has_no_server_clock() && !force && claim.state == RecordState::InFlight
                && let Some(record) = db.record(reference).await? {
                    let ended = now.since(record.ends_at);
                    if ended < SQLITE_SETTLE_MARGIN {
                        return Err(Failed::Refused(format!(
                            "{reference}'s lease ended {}s ago by this machine's clock, less than the {} min \
                             margin: SQLite has no server clock, so a worker whose clock is behind this \
                             machine's may still be running it. Nothing settled; wait, or pass --force \
                             if you know it stopped",
                            ended.as_secs(),
                            SQLITE_SETTLE_MARGIN.as_secs() / 60
                        )));
                    }
                }
            db.store()
                .settle(claim.key, claim.token, &settlement, now)
                .await?;
            let how = match settlement {
                Settlement::Completed(_) => "completed",
                Settlement::Released => "released",
                Settlement::Unknown => "unknown",
            };
            Output {
                text: format!("{reference}: settled as {how}"),
                json: json!({"reference": reference.to_string(), "settled": how}),
            }
        }
        Command::Purge { retention, dry_run } => {
            let older_than = now - *retention;
            let n = if *dry_run {
                db.purgeable(now, older_than).await?
            } else {
                let mut total = 0;
                loop {
                    let n = db.store().purge(now, older_than, 1_000).await?;
                    total += n;
                    if n < 1_000 {
                        break total;
                    }
                }
            };
            let verb = if *dry_run { "would purge" } else { "purged" };
            Output {
                text: format!("{verb} {}", count(n, "record")),
                json: json!({"dry_run": dry_run, "records": n}),
            }
        }
        Command::Stats => {
            let stats = db.stats(now).await?;
            Output {
                text: db::describe_stats(&stats),
                json: stats,
            }
        }
    }))
}
