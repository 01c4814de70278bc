//! The `#[idempotent]` and `#[idempotent_tools]` attributes of the
//! [`idempotency`](https://docs.rs/idempotency) crate. Use them through `idempotency`, which
//! re-exports them; generated code reaches the runtime only through `::idempotency::__private`
//! (override the path with `crate = "..."`).
//!
//! Pipeline (serde_derive / tracing-attributes style), in layers that only call downwards:
//!
//! 1. parse: `attr` reads the options into a typed model; `ast` reads the item (attributes,
//!    visibility and signature with syn, the body kept as unparsed tokens) and then the function
//!    (context, arguments, `Result<T, E>`, rmcp or not);
//! 2. validate: `check` rejects items that cannot be wrapped and weighs the options against the
//!    function; `hint` keeps `idempotentHint` honest;
//! 3. generate: `expand` writes the wrapper (the user's body and one call into the runtime,
//!    whose pieces are `call`'s), the descriptor and the merged `#[tool]`; `fallback` the
//!    stand-in for an rmcp tool that could not be wrapped.
//!
//! `ctxt` (errors, collected and reported together) and `emit` (the item beside the errors) sit
//! below all three; the option spellings and the duration grammar come from
//! `idempotency-options`, which the runtime and the CLI share. On error the
//! original item is emitted beside the errors (for an rmcp tool, with the signature rmcp's router
//! expects, so rmcp adds no follow-on errors).

mod ast;
mod attr;
mod call;
mod check;
mod ctxt;
mod descriptor;
mod emit;
mod expand;
mod fallback;
mod hint;
mod tokens;

use proc_macro::TokenStream;

/// Makes an `async fn` safe to call twice: the key is claimed before the body runs, the outcome
/// is recorded, and a repeat gets the stored answer (or an honest "in flight" / "outcome
/// unknown" / "payload mismatch").
///
/// ```ignore
/// #[idempotent(window = "15m")]
/// async fn charge_card(ctx: &Ctx, args: ChargeArgs) -> Result<Receipt, ChargeError> { ... }
/// ```
///
/// # Options
///
/// All optional; each at most once.
///
/// | option | meaning | default |
/// |---|---|---|
/// | `window = "15m"` | how long a completed answer is replayed, counted from completion | `"15m"` |
/// | `business_key = "order_id"` | key on a field instead of all arguments; a nested path `"order.id"` (tuple fields by index, `"pair.0"`); several fields as a list `["tenant_order", "line"]`. The full arguments are fingerprinted: the same key with other arguments is a payload mismatch | all arguments |
/// | `missing_key = "refuse" \| "call_key"` | what a call without its business key (`null`, `""`) means: refused naming the field, or keyed by all its arguments. Required when a business-key field is an `Option` (without it, a compile error at the field) | refused |
/// | `client_key = "accept" \| "require"` | rmcp tools: a key the client software sends in the request's `_meta` (`"idempotency/key"`) or its `Idempotency-Key` HTTP header keys the call (with the caller's tenant and subject and the tool; the arguments fingerprinted), as SEP-3182 proposed: same key and arguments replay, other arguments are a JSON-RPC error `data.type = "idempotency_key_conflict"`, a repeat while it runs `"idempotency_key_in_progress"`. Without a key: the server's key (`accept`), or a JSON-RPC error naming where the key goes (`require`). Read from the arguments only with `client_key_field`; not with `business_key` or `scope = "tenant"` | no client key |
/// | `client_key_field = "meta.idempotency_key"` | rmcp tools, with `client_key`: read the client's key from this JSON path of the arguments instead (where ACP and UCP put it: `meta.idempotency_key`, `meta.idempotency-key`), for protocols whose platform software, not the model, fills it; the field is left out of the fingerprint | `_meta` or the header |
/// | `answers = "mcp" \| "acp" \| "ucp"` | rmcp tools: the shape of the wrapper's own answers: this library's, or a JSON-RPC `-32000` error carrying ACP's `Error` object or a UCP error message (`idempotency_conflict`, `idempotency_in_flight` with `retry_after`, `idempotency_key_required`...) | `"mcp"` |
/// | `scope = "tenant" \| "subject"` | who shares the records (and may ask their status): every subject of the caller's tenant, or only the caller's subject | `"tenant"` for business keys, `"subject"` for call keys |
/// | `ignore = ["sent_at", "meta.request_id", "meta.*"]` | fields left out of the key and the fingerprint, by their JSON path through objects (volatile values a retry carries fresh, such as ACP's `meta.request_id`, `meta.timestamp` and `meta.signature`; the handler still reads them). A path ending in `.*` names the members of that object the arguments' type does not declare: an rmcp tool accepts them instead of refusing them, lists that object open in its input schema, and keys none of them (the typed arguments do not carry them); `.*` only as the last segment, and not `*` alone | none |
/// | `name = "charge_card"` | the tool name in the key | rmcp: `#[tool(name = ...)]`, else the fn name |
/// | `on_error = "retryable" \| "definitive" \| "unknown"` | one disposition for every error | each error's `idempotency::Classify` |
/// | `timeout = "30s"` | abandon a running call as "outcome unknown" after this | none |
/// | `wait = "3s"` | a repeat that finds the call in progress waits up to this (and the `timeout`) for its answer instead of answering "in progress" at once | the engine's (`IdempotencyBuilder::wait`, default none) |
/// | `recover = "unknown" \| "rerun" \| "reconcile"` | once the call's worker is gone (crash, panic, timeout, lost completion): repeats are told "outcome unknown"; or the next repeat runs the body again under the same reference (for side effects that deduplicate on it); or your `Reconcile` settles it | `"unknown"` |
/// | `context = "ctx"` | the context parameter (plain mode) | see below |
/// | `task` | rmcp tools: a client that declared the tasks extension gets a durable task (see `idempotency::mcp::task`); the server must be `Clone + Send + Sync + 'static` | answered inline |
/// | `transactional` | the claim, the handler's writes (through `Call::transaction`) and the outcome in one transaction of the store's database (SQLite, PostgreSQL): one commit, no lease; a dead worker leaves nothing and the next repeat runs once | a claim and a completion, each committed |
/// | `crate = "::idempotency"` | the runtime's path, for a renamed dependency | `::idempotency` |
///
/// Durations are a positive whole number and a unit: `ms`, `s`, `m`, `h` or `d` (`"500ms"`,
/// `"90s"`, `"15m"`, `"2h"`, `"1d"`), at most `u64::MAX` milliseconds.
///
/// # Plain functions and methods
///
/// - **Context**: the parameter named by `context`, else the first parameter whose type is a
///   reference `&Ctx` (or `&mut Ctx`), else `&self`. It implements
///   `idempotency::IdempotencyContext` (that is, `IdempotencyContext<()>`: the engine, and the
///   caller for the request `()`). The engine and the caller are read through a shared reborrow
///   before the body runs, so the body may use the context as it likes, even a `&mut Ctx`.
/// - **Arguments**: exactly one other parameter, any pattern, `T: Serialize`; the key is computed
///   from its canonical JSON. No generic parameters, no `impl Trait` arguments.
/// - **Return type**: `Result<T, E>` spelled with two type arguments (any path ending in
///   `Result`), `T: Serialize + DeserializeOwned`, `E: From<idempotency::Error> + Display`
///   (`+ Serialize + DeserializeOwned` when its errors can be definitive, i.e. stored).
/// - **Descriptor**: a free function `charge_card` gets a module `charge_card` holding
///   `pub const TOOL: ToolSpec` (so no other item may be named `charge_card` in that module's
///   type namespace); a method `charge_card` gets the associated const `CHARGE_CARD_TOOL` (the
///   name upper-cased, `_TOOL` appended). An attribute on a function cannot see the block around
///   it, so two places need `#[idempotent_tools]` on the impl block: an associated fn without
///   `self` (taking `ctx: &Ctx`; it then gets the associated const, not a module), and a method
///   of an `impl Trait for X` (which can hold only the trait's items: its descriptor stays in its
///   body, and there is no `CHARGE_CARD_TOOL`). Without it, rustc reports "const
///   `CHARGE_CARD_TOOL` is not a member of trait" (or a module inside an impl). Both descriptors
///   are `const` items of type `idempotency::tool::ToolSpec` (name, window, timeout).
///
/// # rmcp tools (feature `rmcp`)
///
/// The wrapped future must be `Send`: rmcp's `#[tool(local)]` is refused with a compile error at
/// `local`.
///
/// Place it **above** `#[tool(...)]` on a `&self` method of a `#[tool_router]` impl whose type
/// implements `idempotency::IdempotencyContext<RequestContext<RoleServer>>` (the engine, and the
/// caller read from rmcp's request). It merges `idempotent_hint = true` into the
/// tool's `annotations(...)` (a written `idempotent_hint = false` is an error), keys on `T` of the
/// one `Parameters<T>` argument, takes the caller from the request (its own
/// `RequestContext<RoleServer>` parameter, or one it adds), and answers with a `CallToolResult`
/// (`E: Display` suffices). An answer spelled `Json<T>` (rmcp's structured output) is stored as
/// its `T`, and the tool lists `T`'s `outputSchema` as rmcp would unwrapped; a `CallToolResult`
/// answer is stored and replayed verbatim. The fn name and the `#[tool]` stay, so the router
/// finds the method.
///
/// Inside the body, `idempotency::Call::current()` gives the operation's reference to pass
/// downstream.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(args.into(), item.into()).into()
}

/// On an impl block holding `#[idempotent]` functions (above `#[tool_router]` for rmcp):
///
/// - an `idempotent_hint = true` on a tool that is not wrapped with `#[idempotent]` does not
///   compile (the hint follows the code; it never leads it);
/// - it tells each `#[idempotent]` function it is in an impl, so associated fns without `self`
///   and methods of trait impls can be wrapped (see [`idempotent`]);
/// - a wrapped rmcp `#[tool]` in a trait impl is an error that says where to put it: rmcp
///   routes no tools there (its `#[tool]` and `#[tool_router]` add fns a trait impl cannot hold).
///
/// The impl is otherwise emitted unchanged.
///
/// ```ignore
/// #[idempotent_tools]
/// #[tool_router]
/// impl Payments { ... }
/// ```
#[proc_macro_attribute]
pub fn idempotent_tools(args: TokenStream, item: TokenStream) -> TokenStream {
    let args = proc_macro2::TokenStream::from(args);
    if !args.is_empty() {
        let e = syn::Error::new_spanned(args, "#[idempotent_tools] takes no options");
        return emit::with_error(item.into(), e).into();
    }
    expand::idempotent_tools(item.into()).into()
}

#[cfg(test)]
mod layering {
    /// Each module, lowest layer first: a module may use only modules listed before it, so the
    /// modules form no cycle (parse → validate → generate).
    const LAYERS: &[(&str, &str)] = &[
        ("ctxt", include_str!("ctxt.rs")),
        ("emit", include_str!("emit.rs")),
        ("attr", include_str!("attr.rs")),
        ("ast", include_str!("ast.rs")),
        ("hint", include_str!("hint.rs")),
        ("check", include_str!("check.rs")),
        ("fallback", include_str!("fallback.rs")),
        ("tokens", include_str!("tokens.rs")),
        ("descriptor", include_str!("descriptor.rs")),
        ("call", include_str!("call.rs")),
        ("expand", include_str!("expand.rs")),
    ];

    /// The modules `src` names as `crate::m` or `crate::{m, ..}`.
    fn uses(src: &str) -> Vec<String> {
        let ident = |s: &str| -> String {
            s.trim_start()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        };
        let mut found = Vec::new();
        for (at, _) in src.match_indices("crate::") {
            let rest = &src[at + "crate::".len()..];
            match rest.strip_prefix('{') {
                Some(group) => {
                    let group = &group[..group.find('}').unwrap_or(group.len())];
                    found.extend(group.split(',').map(ident));
                }
                None => found.push(ident(rest)),
            }
        }
        found.retain(|m| !m.is_empty());
        found
    }

    #[test]
    fn modules_only_use_lower_layers() {
        for (i, (module, src)) in LAYERS.iter().enumerate() {
            for used in uses(src) {
                let below = LAYERS[..i].iter().any(|(m, _)| *m == used);
                assert!(below, "`{module}` uses `{used}`, which is not below it");
            }
        }
        assert_eq!(
            uses("use crate::ast::X; use crate::{check, fallback};"),
            ["ast", "check", "fallback"]
        );
    }
}

#[cfg(test)]
mod documented {
    /// The options a table documents: the first cell of each row, up to ` =` or its closing
    /// backtick.
    fn table(src: &str, row: &str) -> Vec<String> {
        let mut found: Vec<String> = src
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix(row))
            .filter_map(|cell| {
                let name: String = cell
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                (!name.is_empty()).then_some(name)
            })
            .collect();
        found.sort();
        found
    }

    fn accepted() -> Vec<String> {
        let mut all: Vec<String> = crate::attr::OPTIONS
            .split(", ")
            .map(|o| o.trim_matches('`').to_owned())
            .collect();
        all.sort();
        all
    }

    /// The attribute's rustdoc table and the README's list every option the attribute accepts,
    /// and nothing else.
    #[test]
    fn every_option_is_documented() {
        assert_eq!(table(include_str!("lib.rs"), "/// | `"), accepted());
        let readme = include_str!("../../README.md");
        let section = &readme[readme
            .find("## The attribute")
            .expect("the README's attribute section")..];
        let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
        assert_eq!(table(section, "| `"), accepted());
    }
}
