//! The `charge_card` server: `charge_card` wrapped with `#[idempotent(window = "15m", recover = "rerun", client_key = "accept", timeout = "30s")]` (the processor deduplicates on the reference; a client may send its own key), `payout`
//! as a task (`#[idempotent(window = "1h", task, timeout = "10m")]`), `refund` left unwrapped (so `tools/list`
//! shows the difference), and `idempotency_status`.
//!
//! Arguments are checked first and their refusal is [`Disposition::Retryable`] (released, not
//! stored): only the processor's own answers are final.

use std::sync::Arc;

use idempotency::mcp::{status_router, task, Identity};
use idempotency::store::{Settlement, StoredResponse, Unsettled};
use idempotency::tasks::Reconcile;
use idempotency::{
    idempotent, idempotent_tools, Call, Caller, Classify, Disposition, Error, Idempotency,
    IdempotencyContext,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    CancelTaskParams, GetTaskParams, GetTaskResult, Implementation, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler};
use serde::{Deserialize, Serialize};

use crate::processor::{Payout, Processor, Receipt};

/// The arguments of `charge_card`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChargeArgs {
    /// Amount in minor units (cents).
    pub amount_cents: u64,
    /// ISO 4217 currency code.
    pub currency: String,
    /// The card token from the checkout page.
    pub card_token: String,
    /// A note on the statement.
    #[serde(default)]
    pub description: Option<String>,
}

/// The currencies the stub processor takes.
pub const CURRENCIES: &[&str] = &["CHF", "EUR", "GBP", "JPY", "USD"];

/// Checks an amount and its currency before the processor is asked (and before anything is
/// stored).
fn check_amount(amount_cents: u64, currency: &str) -> Result<(), ChargeError> {
    if amount_cents == 0 {
        return Err(ChargeError::Invalid("the amount must be positive".into()));
    }
    if !CURRENCIES.contains(&currency) {
        return Err(ChargeError::Invalid(format!(
            "unknown currency {currency:?} (one of {})",
            CURRENCIES.join(", ")
        )));
    }
    Ok(())
}

impl ChargeArgs {
    /// Checks the arguments before the processor is asked (and before anything is stored).
    pub fn validate(&self) -> Result<(), ChargeError> {
        check_amount(self.amount_cents, &self.currency)?;
        if self.card_token.trim().is_empty() {
            return Err(ChargeError::Invalid("the card token is empty".into()));
        }
        Ok(())
    }
}

/// The arguments of `payout`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PayoutArgs {
    /// Amount in minor units (cents).
    pub amount_cents: u64,
    /// ISO 4217 currency code.
    pub currency: String,
}

/// The arguments of `refund`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RefundArgs {
    /// The charge to refund.
    pub charge_id: String,
}

/// Why a charge failed, and what that means for a repeat.
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
pub enum ChargeError {
    /// The arguments are wrong; the processor was not asked. Correct them and call again.
    #[error("invalid charge, nothing was charged: {0}. Correct it and call again.")]
    Invalid(String),
    /// The card was declined: final, replayed to repeats.
    #[error("the card was declined: {0}")]
    Declined(String),
    /// The processor could not be reached before it acted: safe to run again.
    #[error("the payment processor is unavailable; nothing was charged")]
    Unavailable,
}

impl Classify for ChargeError {
    fn disposition(&self) -> Disposition {
        match self {
            // Nothing happened: released, not stored, so it never stands in for a later call.
            ChargeError::Invalid(_) => Disposition::Retryable,
            ChargeError::Declined(_) => Disposition::Definitive,
            ChargeError::Unavailable => Disposition::Retryable,
        }
    }
}

/// The payments MCP server.
#[derive(Clone, Debug)]
pub struct Payments {
    engine: Idempotency,
    identity: Identity,
    /// The stub processor (shared, so tests can count its charges).
    pub processor: Arc<Processor>,
    tool_router: ToolRouter<Self>,
}

impl Payments {
    /// A server on `engine`, charging through `processor`.
    pub fn new(engine: Idempotency, identity: Identity, processor: Arc<Processor>) -> Self {
        Payments {
            engine,
            identity,
            processor,
            tool_router: Self::tool_router() + status_router::<Self>(),
        }
    }
}

/// Settles a `charge_card` claim whose worker never reported, from the processor's own record of
/// its reference: charged → that receipt is the answer; no charge → released (a repeat charges,
/// under the same reference). For the engine's builder:
/// `Idempotency::builder(store).reconcile(charge::reconciler(processor))`.
pub fn reconciler(processor: Arc<Processor>) -> impl Reconcile {
    move |claim: Unsettled| {
        let processor = processor.clone();
        async move {
            match processor.find(&claim.reference.to_string()) {
                Some(receipt) => Ok(Settlement::Completed(StoredResponse {
                    ok: true,
                    body: serde_json::to_string(&receipt)?,
                })),
                None => Ok(Settlement::Released),
            }
        }
    }
}

impl IdempotencyContext<RequestContext<RoleServer>> for Payments {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
        self.identity.resolve(request)
    }
}

#[idempotent_tools]
#[tool_router]
impl Payments {
    /// Charge a card. Safe to repeat: a repeat within 15 minutes returns the first receipt. A
    /// client that sends its own idempotency key (`_meta` "idempotency/key" or the
    /// `Idempotency-Key` header) scopes the call with it.
    #[idempotent(
        window = "15m",
        recover = "rerun",
        client_key = "accept",
        timeout = "30s"
    )]
    #[tool(
        description = "Charge a card. Repeating the same call within 15 minutes returns the first receipt instead of charging again."
    )]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ChargeError> {
        // First, before any side effect: a refusal here releases the claim (see Classify).
        args.validate()?;
        if args.card_token.starts_with("tok_declined") {
            return Err(ChargeError::Declined("insufficient funds".into()));
        }
        let reference = Call::current()
            .map(|c| c.reference().to_string())
            .ok_or(ChargeError::Unavailable)?;
        // `Json`: the receipt is the structured answer, and its schema the tool's `outputSchema`.
        Ok(Json(
            self.processor
                .charge(&reference, args.amount_cents, &args.currency)
                .await,
        ))
    }

    /// Pay out to the merchant's bank: a long job, so a client that declares the tasks extension
    /// gets a task (its id names the claim: `{reference}@{claim time}`) and polls `tasks/get`; a
    /// repeat gets the same task.
    #[idempotent(window = "1h", task, timeout = "10m")]
    #[tool(
        description = "Pay out an amount to the merchant's bank account. A long job: clients that support tasks get a task to poll. Repeating the same call within an hour returns the same payout (or task) instead of paying again."
    )]
    async fn payout(
        &self,
        Parameters(args): Parameters<PayoutArgs>,
    ) -> Result<Json<Payout>, ChargeError> {
        check_amount(args.amount_cents, &args.currency)?;
        let reference = Call::current()
            .map(|c| c.reference().to_string())
            .ok_or(ChargeError::Unavailable)?;
        Ok(Json(
            self.processor
                .payout(&reference, args.amount_cents, &args.currency)
                .await,
        ))
    }

    /// Refund a charge (not wrapped: no idempotent hint).
    #[tool(description = "Refund a charge by its id.")]
    async fn refund(&self, Parameters(args): Parameters<RefundArgs>) -> String {
        format!("refund of {} requested", args.charge_id)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Payments {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tasks()
            .build();
        ServerConfig::new(capabilities).with_server_info(
            Implementation::new("idempotency-charge-card", env!("CARGO_PKG_VERSION"))
                .with_title("Payments (idempotency example)"),
        )
    }

    /// `payout`'s tasks, from the store: any replica answers for any task.
    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        task::get_task(self, request, &context).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        task::cancel_task(self, request, &context).await
    }
}
