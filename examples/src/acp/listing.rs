//! The ACP tools' input schemas as ACP's MCP binding asks them to be listed: `{meta, id,
//! payload}` with `payload` the operation's request schema, every `$ref` resolvable inside the
//! listed schema (the kept definitions under its `$defs`), and `id` and `payload` required where
//! the binding requires them.

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use serde_json::{json, Map, Value};

use super::schema::Schemas;

/// Each ACP tool: its payload's schema (none for `get`), whether it takes an id, whether its
/// payload is required.
const TOOLS: &[(&str, Option<&str>, bool, bool)] = &[
    (
        "create_checkout_session",
        Some("CheckoutSessionCreateRequest"),
        false,
        true,
    ),
    (
        "update_checkout_session",
        Some("CheckoutSessionUpdateRequest"),
        true,
        true,
    ),
    (
        "complete_checkout_session",
        Some("CheckoutSessionCompleteRequest"),
        true,
        true,
    ),
    (
        "cancel_checkout_session",
        Some("CancelSessionRequest"),
        true,
        false,
    ),
    ("get_checkout_session", None, true, false),
];

/// Rewrites the listed input schema of each ACP tool in `router` (their arguments' type is
/// shared, so its own schema says neither which payload nor what is required).
pub(super) fn list_acp_schemas<S>(router: &mut ToolRouter<S>, schemas: &Schemas) {
    for (name, payload, takes_id, payload_required) in TOOLS {
        let Some(route) = router.map.get_mut(*name) else {
            continue;
        };
        let mut schema = (*route.attr.input_schema).clone();
        let defs = schema
            .entry("$defs")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(defs) = defs {
            for (k, v) in schemas.defs() {
                defs.insert(k.clone(), v.clone());
            }
        }
        if let Some(Value::Object(props)) = schema.get_mut("properties") {
            match payload {
                Some(def) => {
                    props.insert("payload".into(), json!({"$ref": format!("#/$defs/{def}")}))
                }
                None => props.remove("payload"),
            };
            if *takes_id {
                props.insert(
                    "id".into(),
                    json!({"type": "string", "description": "The checkout session's id (`cs_…`)."}),
                );
            } else {
                props.remove("id");
            }
        }
        let mut required = vec!["meta"];
        if *takes_id {
            required.push("id");
        }
        if *payload_required {
            required.push("payload");
        }
        schema.insert("required".into(), json!(required));
        schema.insert("additionalProperties".into(), Value::Bool(false));
        route.attr.input_schema = Arc::new(schema);
    }
}
