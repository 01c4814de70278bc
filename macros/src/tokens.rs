//! Token helpers of the generating layer: spans, hygienic locals, the descriptor's name, the
//! business-key access path, and the `#[tool]` attribute with `idempotent_hint = true` merged in.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::{Attribute, Ident, Meta, MetaList};

use crate::ast::{tool_args, Metas};
use crate::attr::{KeyPath, Segment};

/// `tokens` with every span set to `span`: the runtime's path inside a `quote_spanned!`, so that
/// rustc's trait errors point at the user's type rather than at the attribute.
pub(crate) fn respan(tokens: &TokenStream, span: Span) -> TokenStream {
    tokens
        .clone()
        .into_iter()
        .map(|t| match t {
            TokenTree::Group(g) => {
                let mut group = Group::new(g.delimiter(), respan(&g.stream(), span));
                group.set_span(span);
                TokenTree::Group(group)
            }
            mut other => {
                other.set_span(span);
                other
            }
        })
        .collect()
}

/// `tokens` shown at `span` (where an error about them is reported), as [`respan`] does, but a
/// hygienic local (`__idem_…`, see [`local`]) keeps how it resolves.
pub(crate) fn relocate(tokens: &TokenStream, span: Span) -> TokenStream {
    tokens
        .clone()
        .into_iter()
        .map(|t| match t {
            TokenTree::Group(g) => {
                let mut group = Group::new(g.delimiter(), relocate(&g.stream(), span));
                group.set_span(span);
                TokenTree::Group(group)
            }
            TokenTree::Ident(mut id) if id.to_string().starts_with("__idem_") => {
                id.set_span(id.span().located_at(span));
                TokenTree::Ident(id)
            }
            mut other => {
                other.set_span(span);
                other
            }
        })
        .collect()
}

/// A generated local: hygienic (`mixed_site`), so the user's body cannot name it, nor shadow it.
pub(crate) fn local(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

/// The method descriptor's name: `charge_card` → `CHARGE_CARD_TOOL`.
pub(crate) fn const_name(fn_name: &Ident) -> Ident {
    format_ident!(
        "{}_TOOL",
        fn_name.unraw().to_string().to_uppercase(),
        span = fn_name.span()
    )
}

/// `&__idem_args.order.id` (or `&__idem_params.0.order.id`), spanned at the key's string, so a
/// missing field is reported there.
pub(crate) fn key_access(root: &TokenStream, k: &KeyPath) -> TokenStream {
    let segs = k.segments.iter().map(|s| match s {
        Segment::Field(id) => id.to_token_stream(),
        Segment::Index(i) => syn::Index {
            index: *i,
            span: k.span,
        }
        .to_token_stream(),
    });
    quote_spanned!(k.span=> &#root #(.#segs)*)
}

/// `ty`'s last path segment is `name`.
pub(crate) fn is_last(ty: &syn::Type, name: &str) -> bool {
    matches!(ty, syn::Type::Path(t) if t.path.segments.last().is_some_and(|s| s.ident == name))
}

/// `tokens` with every `self` (not `self::`) naming `with` instead, at the user's span.
pub(crate) fn replace_self(tokens: TokenStream, with: &Ident) -> TokenStream {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let path_follows = |i: usize| matches!(trees.get(i + 1), Some(TokenTree::Punct(p)) if p.as_char() == ':' && p.spacing() == proc_macro2::Spacing::Joint);
    trees
        .iter()
        .enumerate()
        .map(|(i, t)| match t {
            TokenTree::Ident(id) if id == "self" && !path_follows(i) => TokenTree::Ident(
                Ident::new(&with.to_string(), with.span().located_at(id.span())),
            ),
            TokenTree::Group(g) => {
                let mut group = Group::new(g.delimiter(), replace_self(g.stream(), with));
                group.set_span(g.span());
                TokenTree::Group(group)
            }
            other => other.clone(),
        })
        .collect()
}

/// `#[tool(...)]` with the tool's client-key mode added to its `meta` (the listing's `_meta`),
/// so client software can tell which tools take its idempotency key: a `meta = expr` of the
/// tool's own is kept, the mode merged into it.
pub(crate) fn merge_client_key(attr: &Attribute, p: &TokenStream, mode: &str) -> Attribute {
    let Ok(metas) = tool_args(attr) else {
        return attr.clone();
    };
    let mut items: Vec<TokenStream> = Vec::new();
    let mut merged = false;
    for m in &metas {
        match m {
            Meta::NameValue(nv) if nv.path.is_ident("meta") => {
                merged = true;
                let own = &nv.value;
                let own = quote!(::core::option::Option::Some(#own));
                items.push(quote!(meta = #p::mcp::client_key_meta(#mode, #own)));
            }
            other => items.push(other.into_token_stream()),
        }
    }
    if !merged {
        let none = quote!(::core::option::Option::None);
        items.push(quote!(meta = #p::mcp::client_key_meta(#mode, #none)));
    }
    let path = attr.path();
    let pound = attr.pound_token;
    let mut out: Attribute = syn::parse_quote!(#pound[#path(#(#items),*)]);
    out.bracket_token = attr.bracket_token;
    out
}

/// What a wrapped tool's listing is inferred from.
pub(crate) struct Listed<'a> {
    /// The arguments' type.
    pub(crate) args: &'a syn::Type,
    /// The `ignore` entries that open an object (`"meta.*"`).
    pub(crate) open: Vec<&'a syn::LitStr>,
    /// The `T` of a `Json<T>` answer.
    pub(crate) output: Option<&'a syn::Type>,
}

/// `#[tool(...)]` with `idempotent_hint = true` merged into its `annotations(...)` (added when
/// absent). Everything else keeps its tokens and spans. Call after
/// `hint::check_tool` passed.
///
/// Unless the tool gives its own `input_schema`, the one rmcp would infer from the arguments type
/// is listed closed (`additionalProperties: false`), as the wrapper refuses fields it cannot key,
/// but for the objects `ignore` opens (`"meta.*"`).
/// A `Json<T>` answer lists `T`'s output schema, as rmcp infers it for an unwrapped tool (whose
/// return type it reads, and which the wrapper rewrites), unless the tool gives its own.
pub(crate) fn merge_hint(attr: &Attribute, p: &TokenStream, listed: &Listed<'_>) -> Attribute {
    let Listed {
        args: args_ty,
        open,
        output,
    } = listed;
    let Ok(metas) = tool_args(attr) else {
        return attr.clone();
    };
    let mut items: Vec<TokenStream> = Vec::new();
    let mut merged = false;
    let own_schema = metas
        .iter()
        .any(|m| matches!(m, Meta::NameValue(nv) if nv.path.is_ident("input_schema")));
    let own_output = metas
        .iter()
        .any(|m| matches!(m, Meta::NameValue(nv) if nv.path.is_ident("output_schema")));
    if let (Some(t), false) = (output, own_output) {
        items.push(quote! {
            output_schema = #p::mcp::output_schema::<#t>()
        });
    }
    if !own_schema {
        items.push(quote! {
            input_schema = #p::mcp::input_schema::<#args_ty>(&[#(#open),*])
                .unwrap_or_else(|e| panic!("Invalid input schema for `{}`: {}", ::core::any::type_name::<#args_ty>(), e))
        });
    }
    for m in &metas {
        match m {
            Meta::List(list) if list.path.is_ident("annotations") => {
                merged = true;
                let inner = list
                    .parse_args_with(Metas::parse_terminated)
                    .unwrap_or_default();
                let has = inner.iter().any(
                    |a| matches!(a, Meta::NameValue(nv) if nv.path.is_ident("idempotent_hint")),
                );
                let mut tokens = list.tokens.clone();
                if !has {
                    if !inner.is_empty() && !inner.trailing_punct() {
                        tokens.extend(quote!(,));
                    }
                    tokens.extend(quote!(idempotent_hint = true));
                }
                let list = MetaList {
                    tokens,
                    ..list.clone()
                };
                items.push(list.into_token_stream());
            }
            other => items.push(other.into_token_stream()),
        }
    }
    if !merged {
        items.push(quote!(annotations(idempotent_hint = true)));
    }
    let path = attr.path();
    let pound = attr.pound_token;
    let mut out: Attribute = syn::parse_quote!(#pound[#path(#(#items),*)]);
    out.bracket_token = attr.bracket_token;
    out
}
