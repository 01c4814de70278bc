//! The parsing layer for the item: the function, body kept as tokens ([`ItemFn`]), read into
//! what generation needs: rmcp tool or not, the context and arguments parameters, the rmcp
//! request, the `Result<T, E>` returned. Only the signature's shape is checked here; rules that
//! combine the options with the function live in `check.rs`.

use proc_macro2::{Delimiter, Group, TokenStream, TokenTree};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{
    Attribute, FnArg, GenericArgument, Ident, LitStr, Meta, Pat, PathArguments, ReturnType,
    Signature, Token, Type, TypeParamBound, Visibility,
};

use crate::attr::{InImpl, Options};
use crate::ctxt::Ctxt;

/// What `#[idempotent]` applies to when the item is not a function at all.
pub(crate) const NOT_A_FN: &str =
    "#[idempotent] applies to an `async fn` (a free function or a `&self` method)";

/// `#[attrs] vis sig { body }`, the body kept as unparsed tokens (tracing-attributes'
/// `MaybeItemFn`, tokio-macros' `ItemFn`): a syntax error in the body is rustc's to report, at the
/// bad token, and the body is not parsed twice.
#[derive(Clone)]
pub(crate) struct ItemFn {
    pub attrs: Vec<Attribute>,
    pub vis: Visibility,
    pub sig: Signature,
    /// The brace-delimited body, as written.
    pub body: Group,
}

/// After the attributes and the visibility: `const`, `async`, `unsafe`, `extern "abi"`, then `fn`.
fn starts_a_fn(input: ParseStream) -> bool {
    let fork = input.fork();
    let _ = fork.parse::<Option<Token![const]>>();
    let _ = fork.parse::<Option<Token![async]>>();
    let _ = fork.parse::<Option<Token![unsafe]>>();
    if fork
        .parse::<Option<Token![extern]>>()
        .is_ok_and(|e| e.is_some())
    {
        let _ = fork.parse::<Option<LitStr>>();
    }
    fork.peek(Token![fn])
}

impl Parse for ItemFn {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        if !starts_a_fn(input) {
            return Err(input.error(NOT_A_FN));
        }
        // syn's own error, at the token of the signature it could not read.
        let sig: Signature = input.parse()?;
        let body = match input.parse::<TokenTree>() {
            Ok(TokenTree::Group(g)) if g.delimiter() == Delimiter::Brace => g,
            Ok(other) => {
                return Err(syn::Error::new(
                    other.span(),
                    "expected the function's body `{ ... }`: #[idempotent] wraps a function with a body",
                ))
            }
            Err(_) => {
                return Err(syn::Error::new_spanned(
                    &sig,
                    "expected the function's body `{ ... }`: #[idempotent] wraps a function with a body",
                ))
            }
        };
        if !input.is_empty() {
            return Err(input.error("unexpected tokens after the function's body"));
        }
        Ok(ItemFn {
            attrs,
            vis,
            sig,
            body,
        })
    }
}

impl ToTokens for ItemFn {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        for a in &self.attrs {
            a.to_tokens(tokens);
        }
        self.vis.to_tokens(tokens);
        self.sig.to_tokens(tokens);
        self.body.to_tokens(tokens);
    }
}

/// `Pin<Box<dyn Future<Output = ..> + ..>>` (any paths ending in `Pin`, `Box`, `Future`): the
/// shape rmcp's `#[tool]` gives an `async fn`. Read from the syntax tree, not from its text.
pub(crate) fn is_boxed_future(ret: &ReturnType) -> bool {
    let ReturnType::Type(_, ty) = ret else {
        return false;
    };
    let Some(boxed) = only_type_arg(ty, "Pin") else {
        return false;
    };
    let Some(Type::TraitObject(object)) = only_type_arg(boxed, "Box").map(ungroup) else {
        return false;
    };
    object.bounds.iter().any(|b| match b {
        TypeParamBound::Trait(t) => last_segment_is(&t.path, "Future"),
        _ => false,
    })
}

/// `ty` without invisible or parenthesised grouping.
fn ungroup(mut ty: &Type) -> &Type {
    loop {
        match ty {
            Type::Group(g) => ty = &g.elem,
            Type::Paren(p) => ty = &p.elem,
            _ => return ty,
        }
    }
}

/// `X` of `..::Name<X>`: a path type ending in `name` with exactly one generic argument, a type.
fn only_type_arg<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(p) = ungroup(ty) else {
        return None;
    };
    let seg = p.path.segments.last().filter(|s| s.ident == name)?;
    let PathArguments::AngleBracketed(args) = &seg.arguments else {
        return None;
    };
    match (args.args.len(), args.args.first()) {
        (1, Some(GenericArgument::Type(t))) => Some(t),
        _ => None,
    }
}

pub(crate) enum Mode {
    /// A free function or method taking a context (`IdempotencyContext`).
    Plain,
    /// An rmcp `#[tool]` method; `tool` is the index of that attribute.
    Rmcp { tool: usize },
}

pub(crate) enum Context {
    /// `&self`.
    Receiver,
    /// A parameter `ctx: &Ctx`.
    Param(Ident),
}

/// The parameter the key is computed from (`args: ChargeArgs`, or rmcp's `Parameters<T>`).
pub(crate) struct Args {
    pub index: usize,
    pub pat: Pat,
    /// The type the key is computed from: the parameter's type, or rmcp's `T` of `Parameters<T>`.
    pub keyed: Type,
}

/// rmcp: where the `RequestContext<RoleServer>` comes from.
pub(crate) enum Request {
    /// The user's own parameter, bound to a plain name.
    Named(Ident),
    /// The user's parameter with another pattern (`_`, a destructuring): renamed, then rebound.
    Renamed { index: usize, pat: Pat },
    /// No such parameter: one is appended.
    Injected,
}

pub(crate) struct Function {
    pub item: ItemFn,
    pub mode: Mode,
    pub context: Context,
    pub args: Args,
    pub request: Option<Request>,
    /// The return type as written, and its `T` and `E`.
    pub ret: Type,
    pub ok: Type,
    pub err: Type,
    /// rmcp: `T` of an answer spelled `Json<T>` (rmcp's structured output): `T` is what is stored
    /// and replayed, and its schema is the tool's `outputSchema`, as rmcp infers it unwrapped.
    pub structured: Option<Type>,
    /// The tool name in the key.
    pub name: LitStr,
    /// In an impl block (a receiver, or `#[idempotent_tools]` said so): the descriptor is an
    /// associated const, not a module.
    pub method: bool,
    /// In an `impl Trait for X` (`#[idempotent_tools]` said so): the descriptor stays in the body.
    pub in_trait: bool,
}

pub(crate) fn last_segment_is(path: &syn::Path, name: &str) -> bool {
    path.segments.last().is_some_and(|s| s.ident == name)
}

pub(crate) fn is_attr(attr: &Attribute, name: &str) -> bool {
    last_segment_is(attr.path(), name)
}

fn type_last_is(ty: &Type, name: &str) -> bool {
    match ty {
        Type::Path(p) => p.qself.is_none() && last_segment_is(&p.path, name),
        _ => false,
    }
}

/// `Result<T, E>` (any path ending in `Result` with two type arguments) → (T, E).
fn result_types(ty: &Type) -> Option<(Type, Type)> {
    let Type::Path(p) = ty else { return None };
    let seg = p.path.segments.last()?;
    if seg.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &seg.arguments else {
        return None;
    };
    let mut tys = args.args.iter().filter_map(|a| match a {
        GenericArgument::Type(t) => Some(t.clone()),
        _ => None,
    });
    match (tys.next(), tys.next(), tys.next()) {
        (Some(t), Some(e), None) => Some((t, e)),
        _ => None,
    }
}

/// `T` of `Parameters<T>`.
fn first_type_arg(ty: &Type) -> Option<Type> {
    let Type::Path(p) = ty else { return None };
    let PathArguments::AngleBracketed(args) = &p.path.segments.last()?.arguments else {
        return None;
    };
    args.args.iter().find_map(|a| match a {
        GenericArgument::Type(t) => Some(t.clone()),
        _ => None,
    })
}

fn ident_of(pat: &Pat) -> Option<&Ident> {
    match pat {
        Pat::Ident(pi) if pi.subpat.is_none() && pi.by_ref.is_none() => Some(&pi.ident),
        _ => None,
    }
}

/// Whether the receiver is `&self` (or `self: &Self`).
pub(crate) fn shared_receiver(r: &syn::Receiver) -> bool {
    matches!(&*r.ty, Type::Reference(t) if t.mutability.is_none())
}

impl Function {
    /// Reads `item` (already known to be an `async fn`). `None` when the shape is wrong; the
    /// reasons are in `cx`.
    pub(crate) fn from_item(cx: &mut Ctxt, item: &ItemFn, opts: &Options) -> Option<Function> {
        let sig = &item.sig;
        let tool = item.attrs.iter().position(|a| is_attr(a, "tool"));
        let mode = match tool {
            Some(tool) => Mode::Rmcp { tool },
            None => Mode::Plain,
        };
        let receiver = sig.receiver();
        let typed: Vec<(usize, &syn::PatType)> = sig
            .inputs
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match a {
                FnArg::Typed(t) => Some((i, t)),
                FnArg::Receiver(_) => None,
            })
            .collect();

        let ret_ty = match &sig.output {
            ReturnType::Type(_, t) => Some((**t).clone()),
            ReturnType::Default => None,
        };
        let ok_err = ret_ty.as_ref().and_then(result_types);
        if ok_err.is_none() {
            let msg = "an idempotent function returns `Result<T, E>`: `T` is stored and replayed, `E` carries the handler's errors and the wrapper's answers";
            match &sig.output {
                ReturnType::Type(_, t) => cx.spanned(t, msg),
                ReturnType::Default => cx.error(sig.paren_token.span.close(), msg),
            }
        }

        let (context, args, request) = match mode {
            Mode::Rmcp { .. } => {
                let Some(r) = receiver else {
                    cx.error(
                        sig.ident.span(),
                        "an rmcp tool wrapped with #[idempotent] must be a `&self` method",
                    );
                    return None;
                };
                if !shared_receiver(r) {
                    cx.spanned(r, "an rmcp tool wrapped with #[idempotent] takes `&self`");
                }
                let params: Vec<&(usize, &syn::PatType)> = typed
                    .iter()
                    .filter(|(_, t)| type_last_is(&t.ty, "Parameters"))
                    .collect();
                let args = match params.as_slice() {
                    [(index, t)] => {
                        let Some(keyed) = first_type_arg(&t.ty) else {
                            cx.spanned(
                                &t.ty,
                                "expected `Parameters<T>`, with the arguments' type `T`",
                            );
                            return None;
                        };
                        Args {
                            index: *index,
                            pat: (*t.pat).clone(),
                            keyed,
                        }
                    }
                    [] => {
                        cx.error(
                            sig.paren_token.span.join(),
                            "an idempotent rmcp tool takes its arguments as `Parameters<T>`: the key is computed from `T`",
                        );
                        return None;
                    }
                    [_, (_, second), ..] => {
                        cx.spanned(second, "only one `Parameters<T>` argument is supported");
                        return None;
                    }
                };
                let request = match typed
                    .iter()
                    .find(|(_, t)| type_last_is(&t.ty, "RequestContext"))
                {
                    Some((index, t)) => match ident_of(&t.pat) {
                        Some(id) => Request::Named(id.clone()),
                        None => Request::Renamed {
                            index: *index,
                            pat: (*t.pat).clone(),
                        },
                    },
                    None => Request::Injected,
                };
                (Context::Receiver, args, Some(request))
            }
            Mode::Plain => {
                let ctx_index = match &opts.context {
                    Some(name) => match typed
                        .iter()
                        .find(|(_, t)| ident_of(&t.pat) == Some(&name.value))
                    {
                        Some((i, t)) => {
                            if !matches!(&*t.ty, Type::Reference(_)) {
                                cx.spanned(
                                    &t.ty,
                                    "the context parameter is a reference, like `ctx: &Ctx`",
                                );
                            }
                            Some(*i)
                        }
                        None => {
                            cx.error(
                                name.value.span(),
                                format!("there is no parameter named `{}`", name.value),
                            );
                            return None;
                        }
                    },
                    None => typed
                        .iter()
                        .find(|(_, t)| matches!(&*t.ty, Type::Reference(_)))
                        .map(|(i, _)| *i),
                };
                let context = match ctx_index {
                    Some(i) => {
                        match &sig.inputs[i] {
                            FnArg::Typed(t) => match ident_of(&t.pat) {
                                Some(id) => Context::Param(id.clone()),
                                None => {
                                    cx.spanned(&t.pat, "the context parameter must be a plain name, like `ctx: &Ctx`");
                                    return None;
                                }
                            },
                            FnArg::Receiver(_) => return None,
                        }
                    }
                    None => match receiver {
                        Some(r) if shared_receiver(r) => Context::Receiver,
                        Some(r) => {
                            cx.spanned(
                                r,
                                "#[idempotent] takes the engine and the caller from `&self` (Self: idempotency::IdempotencyContext) or from a parameter `ctx: &Ctx`",
                            );
                            return None;
                        }
                        None => {
                            cx.error(
                                sig.paren_token.span.join(),
                                "#[idempotent] needs a context parameter `ctx: &Ctx` (Ctx: idempotency::IdempotencyContext) to find the engine and the caller; name it with `context = \"...\"` if it is not the first reference parameter",
                            );
                            return None;
                        }
                    },
                };
                let rest: Vec<&(usize, &syn::PatType)> = typed
                    .iter()
                    .filter(|(i, _)| Some(*i) != ctx_index)
                    .collect();
                let args = match rest.as_slice() {
                    [(index, t)] => Args {
                        index: *index,
                        pat: (*t.pat).clone(),
                        keyed: (*t.ty).clone(),
                    },
                    [] => {
                        cx.error(
                            sig.paren_token.span.join(),
                            "#[idempotent] needs one arguments parameter besides the context, like `args: ChargeArgs`: the key is computed from it",
                        );
                        return None;
                    }
                    [_, (_, second), ..] => {
                        cx.spanned(
                            second,
                            "#[idempotent] takes exactly one arguments parameter besides the context: gather the arguments in one struct",
                        );
                        return None;
                    }
                };
                (context, args, None)
            }
        };
        if let Type::ImplTrait(t) = &args.keyed {
            cx.spanned(t, "the arguments of an idempotent function have a concrete type: the key is computed from its canonical JSON, so generic (`impl Trait`) arguments are not supported");
        }

        let name = match (&opts.name, &mode) {
            (Some(n), _) => n.value.clone(),
            (None, Mode::Rmcp { tool }) => tool_name(&item.attrs[*tool])
                .unwrap_or_else(|| LitStr::new(&sig.ident.unraw().to_string(), sig.ident.span())),
            (None, Mode::Plain) => LitStr::new(&sig.ident.unraw().to_string(), sig.ident.span()),
        };
        let (ret, (ok, err)) = (ret_ty?, ok_err?);
        let structured = match mode {
            Mode::Rmcp { .. } => only_type_arg(&ok, "Json").cloned(),
            Mode::Plain => None,
        };
        Some(Function {
            item: item.clone(),
            mode,
            context,
            args,
            request,
            ret,
            ok,
            err,
            structured,
            name,
            method: receiver.is_some() || opts.in_impl.is_some(),
            in_trait: opts
                .in_impl
                .as_ref()
                .is_some_and(|i| i.value == InImpl::Trait),
        })
    }
}

/// The comma-separated contents of `#[tool(...)]` or `annotations(...)`.
pub(crate) type Metas = Punctuated<Meta, Token![,]>;

/// The contents of rmcp's `#[tool]` / `#[tool(...)]`.
pub(crate) fn tool_args(attr: &Attribute) -> syn::Result<Metas> {
    match &attr.meta {
        Meta::Path(_) => Ok(Metas::new()),
        Meta::List(list) => list.parse_args_with(Metas::parse_terminated),
        Meta::NameValue(nv) => Err(syn::Error::new(
            nv.eq_token.span,
            "expected #[tool] or #[tool(...)]",
        )),
    }
}

/// `name = "..."` inside `#[tool(...)]`.
fn tool_name(attr: &Attribute) -> Option<LitStr> {
    let metas = tool_args(attr).ok()?;
    metas.iter().find_map(|m| match m {
        syn::Meta::NameValue(nv) if nv.path.is_ident("name") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    })
}

#[cfg(test)]
#[path = "ast_tests.rs"]
mod tests;
