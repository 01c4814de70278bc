//! The `#[idempotent]` and `#[idempotent_tools]` attributes of the
//! [`idempotency`](https://docs.rs/idempotency) crate. Use them through `idempotency`, which
//! re-exports them; generated code reaches the runtime only through `::idempotency::__private`
//! (override the path with `crate = "..."`).
//!
//! Pipeline (serde_derive / tracing-attributes style): `attr` parses the options into a typed
//! model, `check` rejects items that cannot be wrapped, `ast` reads the function (context,
//! arguments, `Result<T, E>`, rmcp or not), `check` again weighs the options against it,
//! `expand` generates, `hint` keeps `idempotentHint` honest. Errors are collected and reported
//! together; on error the original item is emitted beside them (`fallback`: for an rmcp tool, with
//! the signature rmcp's router expects, so rmcp adds no follow-on errors).

mod ast;
mod attr;
mod check;
mod ctxt;
mod expand;
mod fallback;
mod hint;

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
/// | `name = "charge_card"` | the tool name in the key | rmcp: `#[tool(name = ...)]`, else the fn name |
/// | `on_error = "retryable" \| "definitive" \| "unknown"` | one disposition for every error | each error's `idempotency::Classify` |
/// | `timeout = "30s"` | abandon a running call as "outcome unknown" after this | none |
/// | `context = "ctx"` | the context parameter (plain mode) | see below |
/// | `crate = "::idempotency"` | the runtime's path, for a renamed dependency | `::idempotency` |
///
/// Durations are a positive whole number and a unit: `ms`, `s`, `m`, `h` or `d` (`"500ms"`,
/// `"90s"`, `"15m"`, `"2h"`, `"1d"`), at most `u64::MAX` milliseconds.
///
/// # Plain functions and methods
///
/// - **Context**: the parameter named by `context`, else the first parameter whose type is a
///   reference `&Ctx`, else `&self`. It implements `idempotency::IdempotencyContext` (the engine
///   and the caller).
/// - **Arguments**: exactly one other parameter, any pattern, `T: Serialize`; the key is computed
///   from its canonical JSON. No generic parameters, no `impl Trait` arguments.
/// - **Return type**: `Result<T, E>` spelled with two type arguments (any path ending in
///   `Result`), `T: Serialize + DeserializeOwned`, `E: From<idempotency::Error> + Display`
///   (`+ Serialize + DeserializeOwned` when its errors can be definitive, i.e. stored).
/// - **Descriptor**: a free function `charge_card` gets a module `charge_card` holding
///   `pub const TOOL: ToolSpec` (so no other item may be named `charge_card` in that module's
///   type namespace); a method `charge_card` gets the associated const `CHARGE_CARD_TOOL` (the
///   name upper-cased, `_TOOL` appended) — so it works in inherent impls, not trait impls; an
///   associated fn without `self` is treated as a free function and is not supported. Both
///   report `idempotent_hint() == true`.
///
/// # rmcp tools (feature `rmcp`)
///
/// Place it **above** `#[tool(...)]` on a `&self` method of a `#[tool_router]` impl whose type
/// implements `idempotency::mcp::IdempotentServer`. It merges `idempotent_hint = true` into the
/// tool's `annotations(...)` (a written `idempotent_hint = false` is an error), keys on `T` of the
/// one `Parameters<T>` argument, takes the caller from the request (its own
/// `RequestContext<RoleServer>` parameter, or one it adds), and answers with a `CallToolResult`
/// (`E: Display` suffices). The fn name and the `#[tool]` stay, so the router finds the method.
///
/// Inside the body, `idempotency::Call::current()` gives the operation's reference to pass
/// downstream.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(args.into(), item.into()).into()
}

/// Put above `#[tool_router]`: an `idempotent_hint = true` on a tool that is not wrapped with
/// `#[idempotent]` does not compile. The hint follows the code; it never leads it. The impl is
/// emitted unchanged.
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
        return expand::with_error(item.into(), e).into();
    }
    hint::check_impl(item.into()).into()
}
