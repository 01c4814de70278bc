//! A PostgreSQL schema of a test's own.

/// A PostgreSQL schema of this test, dropped with everything in it when the value is.
pub(crate) struct Schema {
    url: String,
    name: String,
}

impl Schema {
    pub(crate) async fn create(url: &str, what: &str) -> Schema {
        use sqlx::Connection;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let name = format!(
            "idem_ex_{what}_{:x}{:x}",
            std::process::id(),
            nanos & 0xffff_ffff_ffff
        );
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .expect("connect to DATABASE_URL");
        let create = format!("CREATE SCHEMA \"{name}\"");
        sqlx::raw_sql(sqlx::AssertSqlSafe(create))
            .execute(&mut conn)
            .await
            .expect("create the test schema");
        conn.close().await.ok();
        Schema {
            url: url.to_owned(),
            name,
        }
    }

    /// `DATABASE_URL` with this schema as its `search_path` (sqlx's `options[...]` parameter).
    pub(crate) fn url(&self) -> String {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}options%5Bsearch_path%5D={}", self.url, self.name)
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        // From a thread of its own: this runs inside the test's runtime.
        let (url, name) = (self.url.clone(), self.name.clone());
        let cleanup = std::thread::spawn(move || {
            use sqlx::Connection;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&url).await {
                    let drop = format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE");
                    if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
                        .execute(&mut conn)
                        .await
                    {
                        eprintln!("could not drop test schema {name}: {e}");
                    }
                    conn.close().await.ok();
                }
            });
        });
        cleanup.join().ok();
    }
}
