//! The merchant's idempotency store: Redis with `REDIS_URL`, else as the other examples choose
//! (PostgreSQL with `DATABASE_URL`, else the SQLite file).

use idempotency::store::RedisStore;
use idempotency::Idempotency;

use crate::{chain, engine_and_database_from_env, secret_from_env, wait_from_env, SecretUse};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The engine on the store the environment names, and a line saying which. `REDIS_URL`: a Redis
/// (or Valkey) server, its keys under `IDEMPOTENCY_REDIS_NAMESPACE` (default `idem`), the secret
/// required as for PostgreSQL. Both `REDIS_URL` and `DATABASE_URL` set is refused rather than
/// one of them silently unused.
pub async fn engine_from_env() -> Result<(Idempotency, String), BoxError> {
    let Ok(url) = std::env::var("REDIS_URL") else {
        let (engine, _, store) = engine_and_database_from_env().await?;
        return Ok((engine, store));
    };
    if std::env::var_os("DATABASE_URL").is_some() {
        return Err("both REDIS_URL and DATABASE_URL are set: unset the one the merchant should not keep its records in".into());
    }
    let secret = secret_from_env(SecretUse::Shared("REDIS_URL"))?;
    let mut builder = RedisStore::builder();
    if let Ok(namespace) = std::env::var("IDEMPOTENCY_REDIS_NAMESPACE") {
        builder = builder.namespace(namespace);
    }
    let store = builder
        .connect(&url)
        .await
        .map_err(|e| format!("cannot open the Redis store at REDIS_URL: {}", chain(&e)))?;
    let engine = Idempotency::builder(store)
        .secret(secret)
        .wait(wait_from_env()?)
        .start()
        .await
        .map_err(|e| {
            format!(
                "cannot start on the Redis store at REDIS_URL: {}",
                chain(&e)
            )
        })?;
    Ok((engine, "Redis (REDIS_URL)".into()))
}
