//! ACP's MCP tools (ACP's `docs/mcp-binding.md`): `{meta, id, payload}` arguments, the client key
//! in `meta.idempotency_key`, ACP's `Error` in `data` of JSON-RPC `-32000` errors.
//!
//! Inputs are checked in `call_tool`, before the tool (and so before its key is claimed), as
//! the REST layer checks them before its claim: a request refused there leaves no record.

use std::sync::Arc;

use idempotency::mcp::Identity;
use idempotency::{
    idempotent, idempotent_tools, Call, Caller, Error, Idempotency, IdempotencyContext,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ErrorCode, Implementation, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler};

use super::{validate, AcpArgs, AcpError, CheckoutSession, Merchant, Operation};

/// The merchant's MCP server.
#[derive(Clone, Debug)]
pub struct AcpServer {
    engine: Idempotency,
    identity: Identity,
    merchant: Arc<Merchant>,
    tool_router: ToolRouter<Self>,
}

impl AcpServer {
    /// The server on `engine`; with `ucp`, also UCP's `complete_checkout` ([`super::ucp`]).
    pub fn new(
        engine: Idempotency,
        identity: Identity,
        merchant: Arc<Merchant>,
        ucp: bool,
    ) -> Self {
        let mut tool_router = Self::tool_router();
        if !ucp {
            tool_router.remove_route("complete_checkout");
        }
        super::listing::list_acp_schemas(&mut tool_router, merchant.schemas());
        AcpServer {
            engine,
            identity,
            merchant,
            tool_router,
        }
    }

    pub(super) fn merchant(&self) -> &Merchant {
        &self.merchant
    }

    pub(super) fn caller_of(&self, ctx: &RequestContext<RoleServer>) -> Result<Caller, AcpError> {
        self.identity.resolve(ctx).map_err(|e| AcpError {
            status: 401,
            kind: "invalid_request".into(),
            code: "unauthenticated".into(),
            message: e.to_string(),
            param: None,
        })
    }

    /// Runs a checked request inside the tool's claim.
    async fn run(
        &self,
        op: Operation,
        args: AcpArgs,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Json<CheckoutSession>, AcpError> {
        let caller = self.caller_of(ctx)?;
        // Checked again (cheap): `call_tool` checked it before the claim.
        validate(self.merchant.schemas(), op, &args, "$.payload")?;
        let reference = Call::current()
            .map(|c| c.reference().to_string())
            .unwrap_or_default();
        self.merchant
            .run(op, &caller, args, &reference)
            .await
            .map(Json)
    }
}

/// An ACP error as ACP's MCP binding answers it: JSON-RPC `-32000`, ACP's `Error` in `data`.
pub fn rpc_error(e: &AcpError) -> ErrorData {
    ErrorData::new(ErrorCode(-32000), e.message.clone(), Some(e.body()))
}

impl IdempotencyContext<RequestContext<RoleServer>> for AcpServer {
    fn idempotency(&self) -> &Idempotency {
        &self.engine
    }
    fn caller(&self, request: &RequestContext<RoleServer>) -> Result<Caller, Error> {
        self.identity.resolve(request)
    }
}

#[idempotent_tools]
#[tool_router]
impl AcpServer {
    #[idempotent(
        window = "24h",
        client_key = "require",
        client_key_field = "meta.idempotency_key",
        ignore = ["meta.request_id", "meta.timestamp", "meta.signature", "meta.user_agent", "meta.*"],
        answers = "acp"
    )]
    #[tool(
        description = "Create a checkout session (ACP). Arguments {meta, payload}; meta.idempotency_key is required and must be the same on every retry of this request."
    )]
    async fn create_checkout_session(
        &self,
        Parameters(args): Parameters<AcpArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<CheckoutSession>, AcpError> {
        self.run(Operation::Create, args, &ctx).await
    }

    #[idempotent(
        window = "24h",
        client_key = "require",
        client_key_field = "meta.idempotency_key",
        ignore = ["meta.request_id", "meta.timestamp", "meta.signature", "meta.user_agent", "meta.*"],
        answers = "acp"
    )]
    #[tool(
        description = "Update a checkout session's items, buyer or fulfillment (ACP). Arguments {meta, id, payload}; meta.idempotency_key is required."
    )]
    async fn update_checkout_session(
        &self,
        Parameters(args): Parameters<AcpArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<CheckoutSession>, AcpError> {
        self.run(Operation::Update, args, &ctx).await
    }

    #[idempotent(
        window = "24h",
        client_key = "require",
        client_key_field = "meta.idempotency_key",
        ignore = ["meta.request_id", "meta.timestamp", "meta.signature", "meta.user_agent", "meta.*"],
        answers = "acp"
    )]
    #[tool(
        description = "Pay for a checkout session and place the order (ACP). Arguments {meta, id, payload}; meta.idempotency_key is required: a retry with the same key returns the first answer and charges nothing more."
    )]
    async fn complete_checkout_session(
        &self,
        Parameters(args): Parameters<AcpArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<CheckoutSession>, AcpError> {
        self.run(Operation::Complete, args, &ctx).await
    }

    #[idempotent(
        window = "24h",
        client_key = "require",
        client_key_field = "meta.idempotency_key",
        ignore = ["meta.request_id", "meta.timestamp", "meta.signature", "meta.user_agent", "meta.*"],
        answers = "acp"
    )]
    #[tool(
        description = "Cancel a checkout session (ACP). Arguments {meta, id, payload?}; meta.idempotency_key is required."
    )]
    async fn cancel_checkout_session(
        &self,
        Parameters(args): Parameters<AcpArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<CheckoutSession>, AcpError> {
        self.run(Operation::Cancel, args, &ctx).await
    }

    /// A read: not keyed.
    #[tool(
        description = "Get a checkout session's current state (ACP). Arguments {meta, id}.",
        annotations(read_only_hint = true)
    )]
    async fn get_checkout_session(
        &self,
        Parameters(args): Parameters<AcpArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<CheckoutSession>, ErrorData> {
        if args.payload.is_some() {
            let e = AcpError::invalid("get takes no payload".into(), Some("$.payload".into()));
            return Err(rpc_error(&e));
        }
        let caller = self.caller_of(&ctx).map_err(|e| rpc_error(&e))?;
        let id = args.id.unwrap_or_default();
        self.merchant
            .get(&caller, &id)
            .map(Json)
            .map_err(|e| rpc_error(&e))
    }

    #[idempotent(
        window = "24h",
        client_key = "require",
        client_key_field = "meta.idempotency-key",
        answers = "ucp"
    )]
    #[tool(
        description = "UCP: complete a checkout (place the order). Arguments {meta, id, checkout}; meta[\"idempotency-key\"] is required."
    )]
    async fn complete_checkout(
        &self,
        Parameters(args): Parameters<super::ucp::UcpComplete>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<CheckoutSession>, AcpError> {
        super::ucp::complete(self, args, &ctx).await
    }
}

/// The operation a tool name stands for, among those checked before the call.
fn operation(tool: &str) -> Option<Operation> {
    Some(match tool {
        "create_checkout_session" => Operation::Create,
        "update_checkout_session" => Operation::Update,
        "complete_checkout_session" => Operation::Complete,
        "cancel_checkout_session" => Operation::Cancel,
        _ => return None,
    })
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for AcpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("idempotency-acp-checkout", env!("CARGO_PKG_VERSION"))
                .with_title("ACP checkout (idempotency example)"),
        )
    }

    /// Checks an ACP tool's arguments against ACP's schemas before the tool runs (so before its
    /// key is claimed); arguments that do not even parse are left to the tool's own `-32602`.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if let Some(op) = operation(&request.name) {
            let raw = serde_json::Value::Object(request.arguments.clone().unwrap_or_default());
            if let Ok(args) = serde_json::from_value::<AcpArgs>(raw) {
                validate(self.merchant.schemas(), op, &args, "$.payload").map_err(|mut e| {
                    e.message
                        .push_str(". Nothing was done: correct it and call again.");
                    rpc_error(&e)
                })?;
                if let Some(id) = &args.id {
                    let caller = self.caller_of(&context).map_err(|e| rpc_error(&e))?;
                    self.merchant.get(&caller, id).map_err(|e| rpc_error(&e))?;
                }
            }
        }
        let tcc = ToolCallContext::new(self, request, context);
        self.tool_router.call(tcc).await
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};
    use idempotency::key::ClientKey;
    use idempotency::tool::Prepared;
    use serde_json::json;

    use super::*;

    /// The tools the macro wraps and the REST layers guard one operation each, with one spec.
    #[test]
    fn each_tool_and_its_route_share_one_spec() {
        assert_eq!(
            AcpServer::CREATE_CHECKOUT_SESSION_TOOL,
            Operation::Create.spec()
        );
        assert_eq!(
            AcpServer::UPDATE_CHECKOUT_SESSION_TOOL,
            Operation::Update.spec()
        );
        assert_eq!(
            AcpServer::COMPLETE_CHECKOUT_SESSION_TOOL,
            Operation::Complete.spec()
        );
        assert_eq!(
            AcpServer::CANCEL_CHECKOUT_SESSION_TOOL,
            Operation::Cancel.spec()
        );
    }

    /// A REST request and an MCP call asking the same thing, each with its own request id,
    /// signature, time and user agent, derive one key and one fingerprint.
    #[test]
    fn a_rest_request_and_its_mcp_call_derive_one_key_and_fingerprint() {
        let key = "5f0c9a8e-7c1d-4d1e-9b2a-3c4d5e6f7a8b";
        let payload = json!({"payment_data": {"handler_id": "h", "instrument": {"type": "card", "credential": {"type": "spt", "token": "spt_1"}}}, "buyer": {"email": "a@b.c"}});
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("api-version", "2026-01-30"),
            ("idempotency-key", key),
            ("request-id", "req_rest"),
            ("signature", "sig-rest"),
            ("timestamp", "2026-12-06T10:00:00Z"),
            ("user-agent", "curl/8"),
            ("accept-language", "en-US"),
            ("content-type", "application/json"),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
        // The body's member order differs from the MCP call's.
        let body = br#"{"buyer": {"email": "a@b.c"}, "payment_data": {"instrument": {"credential": {"token": "spt_1", "type": "spt"}, "type": "card"}, "handler_id": "h"}}"#;
        let rest = crate::acp::rest::read(
            Operation::Complete,
            &headers,
            "/checkout_sessions/cs_1/complete",
            body,
        )
        .expect("a readable request");
        let rest = serde_json::to_value(&rest).expect("a value");
        let mcp: AcpArgs = serde_json::from_value(json!({
            "meta": {"api_version": "2026-01-30", "idempotency_key": key, "request_id": "req_mcp",
                     "signature": "sig-mcp", "timestamp": "2026-12-06T10:00:09Z", "accept_language": "en-US"},
            "id": "cs_1",
            "payload": payload,
        }))
        .expect("the tool's arguments");
        let caller = Caller::new("acme", "alice");
        let spec = Operation::Complete.spec();
        let key = ClientKey::new(key).expect("a key");
        let by_rest = Prepared::client(&caller, &spec, &key, &rest).expect("keyed");
        let by_mcp = Prepared::client(&caller, &spec, &key, &mcp).expect("keyed");
        assert_eq!(by_rest.key, by_mcp.key);
        assert_eq!(by_rest.fingerprint, by_mcp.fingerprint);
        // And a different payload is a different fingerprint under the same key.
        let mut other = mcp.clone();
        other.payload = Some(json!({"payment_data": {"purchase_order_number": "PO-1"}}));
        let by_other = Prepared::client(&caller, &spec, &key, &other).expect("keyed");
        assert_eq!(by_other.key, by_mcp.key);
        assert_ne!(by_other.fingerprint, by_mcp.fingerprint);
        // So is another language: the answer's messages would differ.
        let mut french = mcp;
        french.meta.accept_language = Some("fr-FR".into());
        let by_french = Prepared::client(&caller, &spec, &key, &french).expect("keyed");
        assert_ne!(by_french.fingerprint, by_mcp.fingerprint);
    }
}
