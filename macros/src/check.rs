//! The validating layer: rules that need more than one piece: the item as a whole (async, order
//! with rmcp's `#[tool]`, applied twice, generics) before it is read, and the options against the
//! function after (with `hint`'s rules for the `#[tool]` attribute).

use syn::GenericParam;

use crate::ast::{is_attr, is_boxed_future, Function, ItemFn, Mode};
use crate::attr::{Options, Scope};
use crate::ctxt::Ctxt;
use crate::hint;

/// Checks the raw item. `false` when it cannot be read further (not an `async fn`).
pub(crate) fn item(cx: &mut Ctxt, item: &ItemFn) -> bool {
    for a in item.attrs.iter().filter(|a| is_attr(a, "idempotent")) {
        cx.spanned(a, "#[idempotent] is applied twice; keep one");
    }
    let sig = &item.sig;
    if sig.asyncness.is_none() {
        if is_boxed_future(&sig.output) {
            cx.error(
                sig.fn_token.span,
                "place #[idempotent] above #[tool]: below it, rmcp has already turned the async fn into a boxed future and generated the tool's annotations",
            );
        } else {
            cx.error(
                sig.fn_token.span,
                "#[idempotent] wraps an `async fn`; make this function async",
            );
        }
        return false;
    }
    if let Some(g) = sig
        .generics
        .params
        .iter()
        .find(|p| !matches!(p, GenericParam::Lifetime(_)))
    {
        cx.spanned(
            g,
            "#[idempotent] does not support generic functions: the key is computed from the canonical JSON of one concrete argument type",
        );
    }
    if let Some(v) = &sig.variadic {
        cx.spanned(v, "#[idempotent] does not support variadic functions");
    }
    true
}

/// Checks the options against the function read from the item.
pub(crate) fn function(cx: &mut Ctxt, f: &Function, opts: &Options) {
    if let Mode::Rmcp { tool } = f.mode {
        if !cfg!(feature = "rmcp") {
            cx.spanned(
                &f.item.attrs[tool],
                "#[idempotent] on an rmcp #[tool]: enable the `rmcp` feature of idempotency",
            );
        }
        if let Some(c) = &opts.context {
            cx.error(
                c.span,
                "`context` does not apply to rmcp tools: the engine and the caller come from `self` (idempotency::IdempotencyContext<RequestContext<RoleServer>>) and the request",
            );
        }
        hint::check_tool(cx, &f.item.attrs[tool]);
    }
    if let Some(t) = &opts.task {
        match f.mode {
            Mode::Plain => cx.error(
                t.span,
                "`task` applies to rmcp tools: an MCP client that declared the tasks extension gets a task handle; wrap an rmcp #[tool] method, or drop `task`",
            ),
            Mode::Rmcp { .. } => {
                if let syn::Type::Path(p) = &f.ok
                    && p.path.segments.last().is_some_and(|s| s.ident == "CallToolResponse") {
                        cx.spanned(
                            &f.ok,
                            "a `task` tool answers `T`, `Json<T>` or `CallToolResult`: its answer is the task's result (an `input_required` round cannot be one)",
                        );
                    }
            }
        }
    }
    if let Some(t) = &opts.transactional {
        if let Some(r) = &opts.recover {
            cx.error(
                r.span,
                "a `transactional` call is never left unknown: if its worker dies, the database rolls it back and the next repeat runs it once; drop `recover`",
            );
        }
        if opts.task.is_some() {
            cx.error(
                t.span,
                "`transactional` and `task` cannot be combined: a task outlives the request, a transaction must not; drop one",
            );
        }
    }
    if let Some(c) = &opts.client_key {
        if matches!(f.mode, Mode::Plain) {
            cx.error(
                c.span,
                "`client_key` applies to rmcp tools: the key comes from the MCP request's `_meta` or its `Idempotency-Key` header; drop it, or derive a key with `business_key`",
            );
        }
        if opts.business_key.is_some() {
            cx.error(
                c.span,
                "`client_key` and `business_key` cannot be combined: a call has one key, the client's or the business key; drop one",
            );
        }
        if let Some(s) = opts.scope.as_ref().filter(|s| s.value == Scope::Tenant) {
            cx.error(
                s.span,
                "a client key is the caller's own: with `client_key`, records are scoped to the caller's subject; drop `scope = \"tenant\"`",
            );
        }
    }
    if let (Some(k), None) = (&opts.client_key_field, &opts.client_key) {
        cx.error(
            k.span,
            "`client_key_field` says where the client's key is; say whether a call must carry one: add `client_key = \"require\"` (refuse a call without it) or `client_key = \"accept\"` (key it by its arguments)",
        );
    }
    if let (Some(a), Mode::Plain) = (&opts.answers, &f.mode) {
        cx.error(
            a.span,
            "`answers` shapes an rmcp tool's answers (JSON-RPC errors); a plain function answers with its own error type: drop it",
        );
    }
    if let (Some(m), None) = (&opts.missing_key, &opts.business_key) {
        cx.error(
            m.span,
            "`missing_key` says what a call without its business key means; give `business_key` too, or drop it",
        );
    }
    if let Some(ignore) = &opts.ignore {
        for (i, f) in ignore.value.iter().enumerate() {
            let path = f.value();
            if let Some(prev) = ignore.value[..i]
                .iter()
                .find(|prev| overlaps(&prev.value(), &path))
            {
                let prev = prev.value();
                let why = if prev == path {
                    format!("`{path}` is already ignored")
                } else {
                    format!("`{path}` and `{prev}` overlap: ignoring a field ignores everything inside it; keep one")
                };
                cx.error(f.span(), why);
            }
            let keyed = opts.business_key.iter().flat_map(|k| &k.value);
            if let Some(k) = keyed.into_iter().find(|k| overlaps(&k.text, &path)) {
                cx.error(
                    f.span(),
                    format!("`{}` is part of the business key `{}`: a field cannot be both the key and ignored", f.value(), k.text),
                );
            }
        }
    }
    if let Some(keys) = &opts.business_key {
        for (i, k) in keys.value.iter().enumerate() {
            if keys.value[..i].iter().any(|prev| prev.text == k.text) {
                cx.error(
                    k.span,
                    format!("`{}` is already part of the business key", k.text),
                );
            }
        }
    }
}

/// Whether one of two dotted field paths is the other or lies inside it.
fn overlaps(a: &str, b: &str) -> bool {
    let inside = |inner: &str, outer: &str| {
        inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    };
    inside(a, b) || inside(b, a)
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
