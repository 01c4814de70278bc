//! The runtime items the generated code names: every kind of wrapper together reaches the
//! runtime through this list of `__private` paths and no others.

use quote::quote;

use super::tests::expand;

/// The distinct `__private` paths in `out` (`mcp::Call::new`, `ToolSpec`, …).
fn private_paths(out: &str, into: &mut std::collections::BTreeSet<String>) {
    let root = ":: idempotency :: __private";
    for (at, _) in out.match_indices(root) {
        let mut rest = &out[at + root.len()..];
        let mut path = String::new();
        while let Some(next) = rest.strip_prefix(" :: ") {
            let end = next
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(next.len());
            if end == 0 {
                break;
            }
            path.push_str("::");
            path.push_str(&next[..end]);
            rest = &next[end..];
        }
        into.insert(path);
    }
}

/// The generated code is the user's body and one call into the runtime per concern: every kind
/// of wrapper together names these runtime items, and no others (a new one is a decision).
#[test]
fn every_kind_of_wrapper_names_these_runtime_paths_and_no_others() {
    let plain = [
        (quote!(window = "2h"), quote!()),
        (quote!(business_key = ["order_id", "line"]), quote!()),
        (quote!(business_key = "order_id", transactional), quote!()),
    ];
    let mut paths = std::collections::BTreeSet::new();
    for (args, _) in plain {
        let out = expand(
            args,
            quote!(
                async fn charge(ctx: &Ctx, args: A) -> Result<R, E> {
                    Ok(R)
                }
            ),
        );
        assert!(!out.contains("compile_error"), "{out}");
        private_paths(&out, &mut paths);
    }
    let mut expected = vec![
        "::ErrorPolicy",
        "::Tool::new",
        "::ToolSpec",
        "::inventory::submit",
        "::plain::Call::new",
        "::plain::Policy::new",
    ];
    if cfg!(feature = "rmcp") {
        let tools = [
            (quote!(), quote!(#[tool]), quote!(R)),
            (quote!(task), quote!(#[tool]), quote!(CallToolResult)),
            (quote!(), quote!(#[tool]), quote!(CallToolResponse)),
            (
                quote!(client_key = "accept"),
                quote!(#[tool]),
                quote!(Json<R>),
            ),
            (
                quote!(client_key = "require"),
                quote!(#[tool(meta = own())]),
                quote!(R),
            ),
        ];
        for (args, tool, ok) in tools {
            let out = expand(
                args,
                quote!(
                    #tool
                    async fn charge(&self, Parameters(args): Parameters<A>) -> Result<#ok, E> {
                        Ok(R)
                    }
                ),
            );
            assert!(!out.contains("compile_error"), "{out}");
            private_paths(&out, &mut paths);
        }
        expected.extend([
            "::mcp::Answer",
            "::mcp::Call::new",
            "::mcp::Interim",
            "::mcp::RawArguments",
            "::mcp::Request",
            "::mcp::Response",
            "::mcp::client_key_meta",
            "::mcp::input_schema",
            "::mcp::output_schema",
        ]);
    }
    expected.sort_unstable();
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    assert_eq!(paths, expected);
}
