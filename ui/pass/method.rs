//! A `&self` method: the receiver is the context; the descriptor is an associated const.

use idempotency::store::MemoryStore;
use idempotency::{idempotent, Caller, Error, Idempotency, IdempotencyContext};
use serde::Serialize;

struct Server {
    engine: Idempotency,
}

impl IdempotencyContext for Server {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, _: &()) -> Result<Caller, Error> {
        Ok(Caller::new("acme", "alice"))
    }
}

#[derive(Serialize)]
struct ShipArgs {
    parcel: String,
    mut_me: u32,
}

impl Server {
    #[idempotent(window = "2h", timeout = "30s", on_error = "retryable")]
    async fn create_shipment(&self, mut args: ShipArgs) -> Result<String, Error> {
        args.mut_me += 1;
        Ok(format!("{} {}", args.parcel, args.mut_me))
    }

    #[idempotent(name = "ship_v2", on_error = "unknown")]
    pub async fn r#ship(
        &self,
        ShipArgs { parcel, .. }: ShipArgs,
    ) -> std::result::Result<String, Error> {
        Ok(parcel)
    }
}

#[tokio::main]
pub(crate) async fn main() {
    assert_eq!(
        Server::CREATE_SHIPMENT_TOOL.timeout(),
        Some(std::time::Duration::from_secs(30))
    );
    assert_eq!(Server::SHIP_TOOL.name(), "ship_v2");
    let s = Server {
        engine: Idempotency::new(MemoryStore::new()),
    };
    let a = s
        .create_shipment(ShipArgs {
            parcel: "p".into(),
            mut_me: 1,
        })
        .await
        .ok();
    assert_eq!(a.as_deref(), Some("p 2"));
    assert_eq!(
        s.ship(ShipArgs {
            parcel: "q".into(),
            mut_me: 0
        })
        .await
        .ok()
        .as_deref(),
        Some("q")
    );
}
