//! Tests of `expand.rs`.

use super::*;

pub(super) fn expand(args: TokenStream, item: TokenStream) -> String {
    idempotent(args, item).to_string()
}

#[test]
fn plain_fn_gets_a_module_descriptor() {
    let out = expand(
        quote!(window = "2h"),
        quote!(
            async fn charge(ctx: &Ctx, args: A) -> Result<R, E> {
                Ok(R)
            }
        ),
    );
    assert!(out.contains("mod charge"), "{out}");
    assert!(
        out.contains(":: idempotency :: __private :: plain :: Call :: new (& * ctx , charge :: TOOL) . run (__idem_args , | __idem_k , __idem_a | __idem_k . call :: < A > (__idem_a)"),
        "{out}"
    );
    assert!(out.contains("7200000u64"), "{out}");
    assert!(!out.contains("compile_error"), "{out}");
}

#[test]
fn method_gets_an_associated_const() {
    let out = expand(
        quote!(business_key = "order.id"),
        quote!(
            async fn ship(&self, args: A) -> Result<R, E> {
                Ok(R)
            }
        ),
    );
    assert!(out.contains("pub const SHIP_TOOL"), "{out}");
    assert!(out.contains("& (* __idem_a) . order . id"), "{out}");
    assert!(
        out.contains("__idem_k . business :: < A , _ > (\"order.id\" , & (* __idem_a) . order . id , __idem_a)"),
        "{out}"
    );
}

#[test]
fn errors_keep_the_item() {
    let out = expand(
        quote!(colour = "red"),
        quote!(
            async fn charge(ctx: &Ctx, args: A) -> Result<R, E> {
                Ok(R)
            }
        ),
    );
    assert!(out.contains("compile_error"), "{out}");
    assert!(out.starts_with("async fn charge"), "{out}");
    let out = expand(
        quote!(),
        quote!(
            fn charge(ctx: &Ctx, args: A) -> Result<R, E> {
                Ok(R)
            }
        ),
    );
    assert!(out.contains("make this function async"), "{out}");
    let out = expand(
        quote!(),
        quote!(
            struct S;
        ),
    );
    assert!(out.contains("compile_error"), "{out}");
}

#[test]
fn crate_path_is_used() {
    let out = expand(
        quote!(crate = "my_idem"),
        quote!(
            async fn charge(ctx: &Ctx, args: A) -> Result<R, E> {
                Ok(R)
            }
        ),
    );
    assert!(out.contains("my_idem :: __private"), "{out}");
    assert!(!out.contains(":: idempotency ::"), "{out}");
    assert!(out.contains("use super :: * ;"), "{out}");
}

fn merged(attr: Attribute) -> String {
    let listed = Listed {
        args: &syn::parse_quote!(A),
        open: Vec::new(),
        output: None,
    };
    merge_hint(&attr, &quote!(P), &listed)
        .to_token_stream()
        .to_string()
}

const SCHEMA: &str = "input_schema = P :: mcp :: input_schema :: < A > (& []) . unwrap_or_else (| e | panic ! (\"Invalid input schema for `{}`: {}\" , :: core :: any :: type_name :: < A > () , e))";

/// The client-key mode joins the listing's `_meta`, the tool's own `meta` kept inside it.
#[test]
fn the_client_key_mode_joins_the_listing_meta() {
    let attr: Attribute = syn::parse_quote!(#[tool(description = "d")]);
    let out = merge_client_key(&attr, &quote!(P), "accept")
        .to_token_stream()
        .to_string();
    assert!(
        out.contains(
            r#"meta = P :: mcp :: client_key_meta ("accept" , :: core :: option :: Option :: None)"#
        ),
        "{out}"
    );
    let attr: Attribute = syn::parse_quote!(#[tool(meta = own(), name = "n")]);
    let out = merge_client_key(&attr, &quote!(P), "require")
        .to_token_stream()
        .to_string();
    assert!(
        out.contains(r#"meta = P :: mcp :: client_key_meta ("require" , :: core :: option :: Option :: Some (own ()))"#)
            && out.contains(r#"name = "n""#)
            && out.matches("meta").count() == 2,
        "{out}"
    );
}

#[test]
fn merges_into_annotations() {
    assert_eq!(
        merged(syn::parse_quote!(#[tool])),
        format!("# [tool ({SCHEMA} , annotations (idempotent_hint = true))]")
    );
    assert_eq!(
        merged(syn::parse_quote!(#[tool(description = "d")])),
        format!("# [tool ({SCHEMA} , description = \"d\" , annotations (idempotent_hint = true))]")
    );
    assert_eq!(
        merged(syn::parse_quote!(#[rmcp::tool(annotations(title = "T"), name = "n")])),
        format!("# [rmcp :: tool ({SCHEMA} , annotations (title = \"T\" , idempotent_hint = true) , name = \"n\")]")
    );
    assert_eq!(
        merged(syn::parse_quote!(#[tool(annotations(idempotent_hint = true))])),
        format!("# [tool ({SCHEMA} , annotations (idempotent_hint = true))]")
    );
    // A tool's own input schema is kept as it is.
    assert_eq!(
        merged(syn::parse_quote!(#[tool(input_schema = s())])),
        "# [tool (input_schema = s () , annotations (idempotent_hint = true))]"
    );
}

#[test]
fn a_json_answer_lists_its_output_schema() {
    let attr: Attribute = syn::parse_quote!(#[tool]);
    let listed = Listed {
        args: &syn::parse_quote!(A),
        open: Vec::new(),
        output: Some(&syn::parse_quote!(R)),
    };
    let out = merge_hint(&attr, &quote!(P), &listed)
        .to_token_stream()
        .to_string();
    assert_eq!(
        out,
        format!("# [tool (output_schema = P :: mcp :: output_schema :: < R > () , {SCHEMA} , annotations (idempotent_hint = true))]")
    );
    // The tool's own output schema is kept.
    let attr: Attribute = syn::parse_quote!(#[tool(output_schema = s())]);
    let listed = Listed {
        args: &syn::parse_quote!(A),
        open: Vec::new(),
        output: Some(&syn::parse_quote!(R)),
    };
    let out = merge_hint(&attr, &quote!(P), &listed)
        .to_token_stream()
        .to_string();
    assert!(!out.contains("output_schema :: < R >"), "{out}");
    if cfg!(feature = "rmcp") {
        let out = expand(
            quote!(),
            quote!(
                #[tool]
                async fn charge(&self, Parameters(a): Parameters<A>) -> Result<Json<R>, E> {
                    Ok(Json(R))
                }
            ),
        );
        assert!(out.contains(". json (__idem_args ,"), "{out}");
        assert!(out.contains("output_schema :: < R >"), "{out}");
    }
}

#[test]
fn an_impl_tells_its_functions_where_they_are() {
    let out = idempotent_tools(quote!(
        impl Charger for S {
            #[idempotent]
            async fn charge(&self, a: A) -> Result<R, E> { Ok(R) }
            #[idempotent(window = "1h")]
            async fn refund(&self, a: A) -> Result<R, E> { Ok(R) }
        }
    ))
    .to_string();
    assert!(
        out.contains("# [idempotent (__in_impl = \"trait\")]"),
        "{out}"
    );
    assert!(
        out.contains("# [idempotent (__in_impl = \"trait\" , window = \"1h\")]"),
        "{out}"
    );
    let out = expand(
        quote!(__in_impl = "trait"),
        quote!(
            async fn charge(&self, a: A) -> Result<R, E> {
                Ok(R)
            }
        ),
    );
    assert!(!out.contains("CHARGE_TOOL"), "{out}");
    assert!(out.contains("const __IDEM_TOOL"), "{out}");
    let out = expand(
        quote!(__in_impl = "inherent"),
        quote!(
            async fn refund(ctx: &Ctx, a: A) -> Result<R, E> {
                Ok(R)
            }
        ),
    );
    assert!(out.contains("pub const REFUND_TOOL"), "{out}");
    assert!(!out.contains("mod refund"), "{out}");
    // Not an impl: the error says where it goes, beside the item.
    let out = idempotent_tools(quote!(
        struct S;
    ))
    .to_string();
    assert!(out.contains("applies to an `impl` block"), "{out}");
    // A broken body is rustc's to report.
    let item: TokenStream = "impl S { fn f(&self) { let = ; } }".parse().unwrap();
    assert_eq!(idempotent_tools(item.clone()).to_string(), item.to_string());
}

#[test]
fn spec_uses_the_const_builder() {
    let out = expand(
        quote!(window = "2h"),
        quote!(
            async fn charge(ctx: &Ctx, args: A) -> Result<R, E> {
                Ok(R)
            }
        ),
    );
    assert!(
        out.contains(
            ":: idempotency :: __private :: Tool :: new (\"charge\" , 7200000u64) . spec ()"
        ),
        "{out}"
    );
    assert!(!out.contains("timeout_ms"), "{out}");
    assert!(!out.contains("wait_ms"), "{out}");
    assert!(!out.contains("__wrapped"), "{out}");
    let out = expand(
        quote!(timeout = "30s", wait = "3s"),
        quote!(
            async fn ship(&self, args: A) -> Result<R, E> {
                Ok(R)
            }
        ),
    );
    assert!(out.contains(". timeout_ms (30000u64)"), "{out}");
    assert!(out.contains(". wait_ms (3000u64)"), "{out}");
}

#[test]
fn context_is_read_through_a_shared_reborrow() {
    let out = expand(
        quote!(),
        quote!(
            async fn charge(ctx: &mut Ctx, args: A) -> Result<R, E> {
                ctx.count += 1;
                Ok(R)
            }
        ),
    );
    assert!(!out.contains("compile_error"), "{out}");
    let call = ":: idempotency :: __private :: plain :: Call :: new";
    assert!(
        out.contains(&format!("{call} (& * ctx , charge :: TOOL)")),
        "{out}"
    );
    // The context itself is never moved before the body, which moves it.
    assert!(!out.contains("= ctx ;"), "{out}");
    assert!(
        out.contains("charge :: TOOL) . run (__idem_args ,"),
        "{out}"
    );
    let out = expand(
        quote!(),
        quote!(
            async fn ship(&self, args: A) -> Result<R, E> {
                Ok(R)
            }
        ),
    );
    assert!(
        out.contains(&format!("{call} (& * self , SHIP_TOOL)"))
            || out.contains(&format!("{call} (& * self , __IDEM_TOOL)")),
        "{out}"
    );
}

#[test]
fn rmcp_tool_uses_the_context_trait_for_the_request() {
    let out = expand(
        quote!(),
        quote!(
            #[tool]
            async fn charge(&self, Parameters(args): Parameters<A>) -> Result<R, E> {
                Ok(R)
            }
        ),
    );
    if cfg!(feature = "rmcp") {
        assert!(
            out.contains(":: idempotency :: __private :: mcp :: Call :: new (self , & __idem_request , __idem_raw , __IDEM_TOOL)"),
            "{out}"
        );
        assert!(
            out.contains("__idem_request : :: idempotency :: __private :: mcp :: Request"),
            "{out}"
        );
        assert!(
            out.contains("annotations (idempotent_hint = true)"),
            "{out}"
        );
    }
    assert!(!out.contains("IdempotentServer"), "{out}");
}

/// `"meta.*"` opens `meta` in the listed schema and joins the spec's ignored paths; named
/// entries only join the spec.
#[test]
fn an_object_glob_opens_the_listed_schema() {
    let args = quote!(ignore = ["meta.request_id", "meta.*"]);
    let out = expand(
        args.clone(),
        quote!(
            async fn charge(ctx: &Ctx, args: A) -> Result<R, E> {
                Ok(R)
            }
        ),
    );
    assert!(
        out.contains(r#". ignoring (& ["meta.request_id" , "meta.*"])"#),
        "{out}"
    );
    assert!(!out.contains("compile_error"), "{out}");
    if cfg!(feature = "rmcp") {
        let out = expand(
            args,
            quote!(
                #[tool]
                async fn charge(&self, Parameters(args): Parameters<A>) -> Result<R, E> {
                    Ok(R)
                }
            ),
        );
        assert!(
            out.contains(r#"mcp :: input_schema :: < A > (& ["meta.*"])"#),
            "{out}"
        );
        assert!(!out.contains("compile_error"), "{out}");
    }
}

/// `client_key`: the call reads the key from the request (the runtime's `Call::prepare` looks at
/// it before the arguments), and the key step keys by it when the request carried one.
#[test]
fn a_client_key_is_read_from_the_request_and_answers_through_keyed() {
    let out = expand(
        quote!(client_key = "require"),
        quote!(
            #[tool]
            async fn charge(&self, Parameters(args): Parameters<A>) -> Result<R, E> {
                Ok(R)
            }
        ),
    );
    if cfg!(feature = "rmcp") {
        let p = ":: idempotency :: __private";
        assert!(
            out.contains(&format!(
                "{p} :: mcp :: Call :: new (self , & __idem_request , __idem_raw , __IDEM_TOOL) . require_client_key (& __idem_request)"
            )),
            "{out}"
        );
        assert!(
            out.contains("| __idem_k , __idem_a | __idem_k . call :: < A > (__idem_a)"),
            "{out}"
        );
    } else {
        assert!(out.contains("compile_error"), "{out}");
    }
}

#[test]
fn body_is_kept_as_tokens() {
    // A syntax error in the body is not ours to report: the body is emitted as written.
    let item: TokenStream =
        "async fn charge(ctx: &Ctx, args: A) -> Result<R, E> { let x = ; Ok(R) }"
            .parse()
            .unwrap();
    let out = expand(quote!(), item);
    assert!(!out.contains("compile_error"), "{out}");
    assert!(out.contains("move | args | async move"), "{out}");
    assert!(out.contains("{ let x = ; Ok (R) }"), "{out}");
}

#[test]
fn what_is_not_a_function_keeps_a_precise_error() {
    let out = expand(
        quote!(),
        quote!(
            struct S;
        ),
    );
    assert!(out.contains("applies to an `async fn`"), "{out}");
    assert!(out.starts_with("struct S ;"), "{out}");
    // A broken signature: syn's own error, not "applies to an async fn".
    let out = expand(
        quote!(),
        quote!(async fn charge(ctx: &Ctx, args:) -> R { 1 }),
    );
    assert!(out.contains("compile_error"), "{out}");
    assert!(!out.contains("applies to an `async fn`"), "{out}");
    let out = expand(
        quote!(),
        quote!(
            async fn charge(ctx: &Ctx, args: A) -> Result<R, E>;
        ),
    );
    assert!(out.contains("expected the function's body"), "{out}");
    let out = expand(
        quote!(),
        quote!(
            async fn charge(ctx: &Ctx, args: A) -> Result<R, E> {}
            struct S;
        ),
    );
    assert!(
        out.contains("unexpected tokens after the function's body"),
        "{out}"
    );
}

proptest::proptest! {
    #[test]
    fn never_panics(args in "[a-z_=\", \\[\\]0-9.]{0,30}", sig in "[a-z_:&,() <>]{0,30}") {
        if let (Ok(a), Ok(s)) = (args.parse::<TokenStream>(), format!("async fn f({sig}) -> Result<u8, E> {{ Ok(1) }}").parse::<TokenStream>()) {
            let _ = idempotent(a, s);
        }
    }
}
