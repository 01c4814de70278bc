//! The `#[idempotent]` attribute of the [`idempotency`](https://docs.rs/idempotency) crate. Use it
//! through `idempotency`, which re-exports it; generated code reaches the runtime only through
//! `::idempotency::__private` (override the path with `crate = "..."`).
//!
//! Pipeline (serde_derive / tracing-attributes style): [`attr`] parses the options into a typed
//! model, [`ast`] reads the function (context, arguments, `Result<T, E>`, rmcp or not) and checks
//! it, [`expand`] generates, [`hint`] keeps `idempotentHint` honest. Errors are collected and
//! reported together; on error the original item is emitted beside them.

mod ast;
mod attr;
mod ctxt;
mod expand;
mod hint;

use proc_macro::TokenStream;

/// Makes an `async fn` safe to call twice: the key is claimed before the body runs, the outcome
/// is recorded, and a repeat gets the stored answer (or an honest "in flight" / "outcome unknown").
///
/// ```ignore
/// #[idempotent(window = "15m")]
/// async fn charge_card(ctx: &Ctx, args: ChargeArgs) -> Result<Receipt, ChargeError> { ... }
/// ```
///
/// Options (all optional):
///
/// | option | meaning | default |
/// |---|---|---|
/// | `window = "15m"` | how long a completed answer is replayed, from completion (`ms`, `s`, `m`, `h`, `d`) | `"15m"` |
/// | `business_key = "order_id"` | key on a field instead of all arguments; a path `"order.id"`; several `["a", "b"]` | all arguments |
/// | `name = "..."` | the tool name in the key | `#[tool(name)]`, else the fn name |
/// | `on_error = "retryable" \| "definitive" \| "unknown"` | one disposition for every error | `E: idempotency::Classify` |
/// | `timeout = "30s"` | abandon the call as "outcome unknown" after this | none |
/// | `context = "ctx"` | the context parameter | the first `&T` parameter, else `&self` |
/// | `crate = "::idempotency"` | the runtime's path, for renamed dependencies | `::idempotency` |
///
/// **Plain functions and methods.** The context (`ctx: &Ctx` with `Ctx:
/// idempotency::IdempotencyContext`, or `&self`) gives the engine and the caller; the one other
/// parameter is the arguments (`T: Serialize`); the function returns `Result<T, E>` with
/// `T: Serialize + DeserializeOwned` and `E: From<idempotency::Error> + Display`. A free function
/// `charge_card` gets a descriptor `charge_card::TOOL`; a method gets an associated const
/// `CHARGE_CARD_TOOL`; both report `idempotent_hint() == true`.
///
/// **rmcp tools** (feature `rmcp`): place it *above* `#[tool(...)]` on a `&self` method of a
/// `#[tool_router]` impl whose type implements `idempotency::mcp::IdempotentServer`. It merges
/// `idempotent_hint = true` into the tool's `annotations(...)`, keys on `T` of the
/// `Parameters<T>` argument, takes the caller from the request (adding a `RequestContext`
/// parameter if there is none), and answers with a `CallToolResult`.
///
/// Inside the body, `idempotency::Call::current()` gives the operation's reference to pass
/// downstream.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(args.into(), item.into()).into()
}

/// Put above `#[tool_router]`: an `idempotent_hint = true` on a tool that is not wrapped with
/// `#[idempotent]` does not compile. The hint follows the code; it never leads it.
#[proc_macro_attribute]
pub fn idempotent_tools(args: TokenStream, item: TokenStream) -> TokenStream {
    let args = proc_macro2::TokenStream::from(args);
    if !args.is_empty() {
        let e = syn::Error::new_spanned(args, "#[idempotent_tools] takes no options");
        return expand::with_error(item.into(), e).into();
    }
    hint::check_impl(item.into()).into()
}
