//! The attribute's options, parsed into a typed model that keeps each option's spans. Each option
//! is stored by one setter, which rejects a duplicate at the second occurrence; a bad option does
//! not stop the others from being read, so every error is reported at once.

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Ident, LitStr, Token};

use crate::ctxt::Ctxt;
use idempotency_options::{parse_duration, Choice};
pub(crate) use idempotency_options::{Answers, ClientKey, MissingKey, OnError, Recover, Scope};

mod kw {
    syn::custom_keyword!(window);
    syn::custom_keyword!(business_key);
    syn::custom_keyword!(name);
    syn::custom_keyword!(on_error);
    syn::custom_keyword!(timeout);
    syn::custom_keyword!(wait);
    syn::custom_keyword!(context);
    syn::custom_keyword!(scope);
    syn::custom_keyword!(ignore);
    syn::custom_keyword!(missing_key);
    syn::custom_keyword!(__in_impl);
    syn::custom_keyword!(task);
    syn::custom_keyword!(transactional);
    syn::custom_keyword!(recover);
    syn::custom_keyword!(client_key);
    syn::custom_keyword!(client_key_field);
    syn::custom_keyword!(answers);
}

/// Listed in the "unknown option" error.
pub(crate) const OPTIONS: &str =
    "`window`, `business_key`, `missing_key`, `client_key`, `client_key_field`, `answers`, \
                            `scope`, `ignore`, `name`, `on_error`, `timeout`, `wait`, `recover`, `context`, `task`, \
                            `transactional`, `crate`";

/// The replay window when `window` is not given: 15 minutes.
pub(crate) const DEFAULT_WINDOW_MS: u64 = 15 * 60 * 1000;

/// One option's value, with the span of its name (for duplicates) and of its value.
pub(crate) struct Opt<T> {
    pub value: T,
    pub span: Span,
}

/// Where `#[idempotent_tools]` found the function (its hidden `__in_impl` marker): an attribute
/// on a function cannot see the block around it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InImpl {
    /// An inherent `impl X`: the descriptor is an associated const, even without `self`.
    Inherent,
    /// An `impl Trait for X`: it can hold only the trait's items, so the descriptor stays in the
    /// body.
    Trait,
}

/// One business-key field path (`"order.id"` → `["order", "id"]`), spanned at its string.
pub(crate) struct KeyPath {
    pub segments: Vec<Segment>,
    pub text: String,
    pub span: Span,
}

pub(crate) enum Segment {
    Field(Ident),
    Index(u32),
}

#[derive(Default)]
pub(crate) struct Options {
    pub window: Option<Opt<u64>>,
    pub business_key: Option<Opt<Vec<KeyPath>>>,
    pub missing_key: Option<Opt<MissingKey>>,
    /// `client_key`: the client's key from `_meta` or the `Idempotency-Key` header.
    pub client_key: Option<Opt<ClientKey>>,
    /// `client_key_field`: read the client's key from this JSON path of the arguments instead.
    pub client_key_field: Option<Opt<LitStr>>,
    /// `answers`: the shape of the wrapper's own answers (this library's, ACP's, UCP's).
    pub answers: Option<Opt<Answers>>,
    pub scope: Option<Opt<Scope>>,
    pub ignore: Option<Opt<Vec<LitStr>>>,
    pub name: Option<Opt<LitStr>>,
    pub on_error: Option<Opt<OnError>>,
    pub timeout: Option<Opt<u64>>,
    /// `wait`: how long a repeat that finds the call in flight waits for its answer.
    pub wait: Option<Opt<u64>>,
    pub recover: Option<Opt<Recover>>,
    pub context: Option<Opt<Ident>>,
    pub krate: Option<Opt<syn::Path>>,
    /// `task`: an rmcp tool answers clients that declared the tasks extension with a durable task.
    pub task: Option<Opt<()>>,
    /// `transactional`: the claim, the handler's writes and the outcome in one transaction of the
    /// store's database.
    pub transactional: Option<Opt<()>>,
    /// Set by `#[idempotent_tools]`, never by hand.
    pub in_impl: Option<Opt<InImpl>>,
    /// Options met so far, valid or not: a second one is a duplicate either way.
    seen: Vec<&'static str>,
}

fn set<T>(
    cx: &mut Ctxt,
    seen: &mut Vec<&'static str>,
    slot: &mut Option<Opt<T>>,
    key: &'static str,
    span: Span,
    value: Option<T>,
) {
    if seen.contains(&key) {
        cx.error(span, format!("duplicate option `{key}`: give it once"));
        return;
    }
    seen.push(key);
    if let Some(value) = value {
        *slot = Some(Opt { value, span });
    }
}

fn key_path(cx: &mut Ctxt, lit: &LitStr) -> Option<KeyPath> {
    let text = lit.value();
    let mut segments = Vec::new();
    for part in text.split('.') {
        if let Ok(index) = part.parse::<u32>() {
            segments.push(Segment::Index(index));
        } else if let Ok(mut id) = syn::parse_str::<Ident>(part) {
            id.set_span(lit.span());
            segments.push(Segment::Field(id));
        } else {
            let hint = if text.contains(',') {
                "; several keys are written as a list: business_key = [\"a\", \"b\"]"
            } else {
                ""
            };
            cx.error(
                lit.span(),
                format!("`{text}` is not a field of the arguments: expected a field name `order_id` or a path `order.id`{hint}"),
            );
            return None;
        }
    }
    Some(KeyPath {
        segments,
        text,
        span: lit.span(),
    })
}

/// The rest of a malformed option, up to the next `,`.
fn skip_option(input: ParseStream) -> syn::Result<()> {
    while !input.is_empty() && !input.peek(Token![,]) {
        input.parse::<TokenTree>()?;
    }
    Ok(())
}

fn string(input: ParseStream, key: &str, example: &str) -> syn::Result<LitStr> {
    if input.peek(LitStr) {
        input.parse()
    } else {
        Err(input.error(format!("`{key}` takes a string, e.g. {key} = {example}")))
    }
}

impl Options {
    pub(crate) fn parse(cx: &mut Ctxt, tokens: TokenStream) -> Options {
        let mut opts = Options::default();
        let parser = |input: ParseStream| -> syn::Result<()> {
            while !input.is_empty() {
                if let Err(e) = opts.parse_one(cx, input) {
                    cx.push(e);
                    skip_option(input)?;
                }
                if input.is_empty() {
                    break;
                }
                input.parse::<Token![,]>()?;
            }
            Ok(())
        };
        if let Err(e) = parser.parse2(tokens) {
            cx.push(e);
        }
        opts
    }

    fn parse_one(&mut self, cx: &mut Ctxt, input: ParseStream) -> syn::Result<()> {
        let la = input.lookahead1();
        if la.peek(kw::window) || la.peek(kw::timeout) || la.peek(kw::wait) {
            let key: Ident = input.call(Ident::parse_any)?;
            input.parse::<Token![=]>()?;
            let lit = string(input, &key.to_string(), "\"15m\"")?;
            let millis = match parse_duration(&lit.value()) {
                Ok(ms) => Some(ms),
                Err(msg) => {
                    cx.error(lit.span(), msg);
                    None
                }
            };
            let (slot, name) = if key == "window" {
                (&mut self.window, "window")
            } else if key == "wait" {
                (&mut self.wait, "wait")
            } else {
                (&mut self.timeout, "timeout")
            };
            set(cx, &mut self.seen, slot, name, key.span(), millis);
        } else if la.peek(kw::business_key) {
            let key: kw::business_key = input.parse()?;
            input.parse::<Token![=]>()?;
            let paths = if input.peek(syn::token::Bracket) {
                let content;
                let bracket = syn::bracketed!(content in input);
                let lits = content
                    .parse_terminated(|i| string(i, "business_key", "[\"a\", \"b\"]"), Token![,])?;
                if lits.is_empty() {
                    cx.error(
                        bracket.span.join(),
                        "`business_key` needs at least one field",
                    );
                    None
                } else {
                    let all: Vec<Option<KeyPath>> = lits.iter().map(|l| key_path(cx, l)).collect();
                    all.into_iter().collect::<Option<Vec<_>>>()
                }
            } else {
                let lit = string(
                    input,
                    "business_key",
                    "\"order_id\" or [\"tenant_order\", \"line\"]",
                )?;
                key_path(cx, &lit).map(|p| vec![p])
            };
            set(
                cx,
                &mut self.seen,
                &mut self.business_key,
                "business_key",
                key.span,
                paths,
            );
        } else if la.peek(kw::name) {
            let key: kw::name = input.parse()?;
            input.parse::<Token![=]>()?;
            let lit = string(input, "name", "\"charge_card\"")?;
            let ok = if lit.value().is_empty() {
                cx.error(lit.span(), "the tool name must not be empty");
                None
            } else {
                Some(lit)
            };
            set(cx, &mut self.seen, &mut self.name, "name", key.span, ok);
        } else if la.peek(kw::on_error) {
            self.choice(cx, input, |o| &mut o.on_error)?;
        } else if la.peek(kw::scope) {
            self.choice(cx, input, |o| &mut o.scope)?;
        } else if la.peek(kw::recover) {
            self.choice(cx, input, |o| &mut o.recover)?;
        } else if la.peek(kw::missing_key) {
            self.choice(cx, input, |o| &mut o.missing_key)?;
        } else if la.peek(kw::client_key) {
            self.choice(cx, input, |o| &mut o.client_key)?;
        } else if la.peek(kw::answers) {
            self.choice(cx, input, |o| &mut o.answers)?;
        } else if la.peek(kw::client_key_field) {
            let key: kw::client_key_field = input.parse()?;
            input.parse::<Token![=]>()?;
            let lit = string(input, "client_key_field", "\"meta.idempotency_key\"")?;
            let ok = is_field_path(&lit.value());
            if !ok {
                cx.error(lit.span(), format!("`{}` is not a field path: `client_key_field` names the key's field by its JSON name, nested through objects with dots, e.g. client_key_field = \"meta.idempotency_key\"", lit.value()));
            }
            set(
                cx,
                &mut self.seen,
                &mut self.client_key_field,
                "client_key_field",
                key.span,
                ok.then_some(lit),
            );
        } else if la.peek(kw::ignore) {
            let key: kw::ignore = input.parse()?;
            input.parse::<Token![=]>()?;
            let lits: Vec<LitStr> = if input.peek(syn::token::Bracket) {
                let content;
                syn::bracketed!(content in input);
                content
                    .parse_terminated(
                        |i| string(i, "ignore", "[\"sent_at\", \"request_id\"]"),
                        Token![,],
                    )?
                    .into_iter()
                    .collect()
            } else {
                vec![string(
                    input,
                    "ignore",
                    "\"sent_at\" or [\"sent_at\", \"request_id\"]",
                )?]
            };
            let mut ok = !lits.is_empty();
            if lits.is_empty() {
                cx.error(key.span, "`ignore` needs at least one field");
            }
            for lit in &lits {
                if let Some(why) = ignore_path_error(&lit.value()) {
                    cx.error(lit.span(), why);
                    ok = false;
                }
            }
            set(
                cx,
                &mut self.seen,
                &mut self.ignore,
                "ignore",
                key.span,
                ok.then_some(lits),
            );
        } else if la.peek(kw::context) {
            let key: kw::context = input.parse()?;
            input.parse::<Token![=]>()?;
            let lit = string(input, "context", "\"ctx\"")?;
            let value = match lit.parse::<Ident>() {
                Ok(id) => Some(id),
                Err(_) => {
                    cx.error(
                        lit.span(),
                        "`context` names a parameter of the function, e.g. context = \"ctx\"",
                    );
                    None
                }
            };
            set(
                cx,
                &mut self.seen,
                &mut self.context,
                "context",
                key.span,
                value,
            );
        } else if la.peek(Token![crate]) {
            let key: Token![crate] = input.parse()?;
            input.parse::<Token![=]>()?;
            let lit = string(input, "crate", "\"::idempotency\"")?;
            let value = match lit.parse::<syn::Path>() {
                Ok(p) => Some(p),
                Err(_) => {
                    cx.error(lit.span(), "`crate` takes the path of the idempotency crate, e.g. crate = \"::idempotency\"");
                    None
                }
            };
            set(
                cx,
                &mut self.seen,
                &mut self.krate,
                "crate",
                key.span,
                value,
            );
        } else if input.peek(kw::task) && !input.peek2(Token![=]) {
            let key: kw::task = input.parse()?;
            set(
                cx,
                &mut self.seen,
                &mut self.task,
                "task",
                key.span,
                Some(()),
            );
        } else if input.peek(kw::transactional) && !input.peek2(Token![=]) {
            let key: kw::transactional = input.parse()?;
            set(
                cx,
                &mut self.seen,
                &mut self.transactional,
                "transactional",
                key.span,
                Some(()),
            );
        } else if input.peek(kw::__in_impl) {
            let key: kw::__in_impl = input.parse()?;
            input.parse::<Token![=]>()?;
            let lit: LitStr = input.parse()?;
            let value = match lit.value().as_str() {
                "inherent" => Some(InImpl::Inherent),
                "trait" => Some(InImpl::Trait),
                _ => None,
            };
            set(
                cx,
                &mut self.seen,
                &mut self.in_impl,
                "__in_impl",
                key.span,
                value,
            );
        } else if input.peek(Ident::peek_any) {
            let key: Ident = input.call(Ident::parse_any)?;
            if key == "task" || key == "transactional" {
                return Err(syn::Error::new(
                    key.span(),
                    format!("`{key}` is a flag: write `{key}` alone, without a value"),
                ));
            }
            return Err(syn::Error::new(
                key.span(),
                format!("unknown option `{key}`; valid options: {OPTIONS}"),
            ));
        } else {
            return Err(la.error());
        }
        Ok(())
    }

    /// An enum option (`recover = "rerun"`): its spellings and their meanings come from
    /// `idempotency-options`, shared with the runtime.
    fn choice<T: Choice>(
        &mut self,
        cx: &mut Ctxt,
        input: ParseStream,
        slot: fn(&mut Options) -> &mut Option<Opt<T>>,
    ) -> syn::Result<()> {
        let key: Ident = input.call(Ident::parse_any)?;
        input.parse::<Token![=]>()?;
        let lit = string(input, T::OPTION, &format!("\"{}\"", T::EXAMPLE))?;
        let value = match T::parse(&lit.value()) {
            Ok(value) => Some(value),
            Err(msg) => {
                cx.error(lit.span(), msg);
                None
            }
        };
        let mut seen = std::mem::take(&mut self.seen);
        set(cx, &mut seen, slot(self), T::OPTION, key.span(), value);
        self.seen = seen;
        Ok(())
    }

    pub(crate) fn window_ms(&self) -> u64 {
        self.window.as_ref().map_or(DEFAULT_WINDOW_MS, |w| w.value)
    }

    /// The runtime's path: `crate = "..."`, else `::idempotency`.
    pub(crate) fn krate(&self) -> syn::Path {
        match &self.krate {
            Some(p) => p.value.clone(),
            None => syn::parse_quote!(::idempotency),
        }
    }
}

/// Why `path` is no `ignore` entry: a field path, or one followed by `.*` (the members of that
/// object the arguments' type does not declare).
fn ignore_path_error(path: &str) -> Option<String> {
    if path == "*" {
        return Some("`*` alone would accept any argument the type does not declare, a misspelt one too, and key none of them: name the object whose undeclared members to accept, e.g. ignore = [\"meta.*\"]".into());
    }
    let object = path.strip_suffix(".*").unwrap_or(path);
    if !is_field_path(object) {
        return Some(format!("`{path}` is not a field path: `ignore` names fields by their JSON names, nested ones through objects with dots, e.g. ignore = [\"sent_at\", \"meta.request_id\"]"));
    }
    object.contains('*').then(|| format!("`{path}` is not a field path: `*` stands only as the whole last segment, for the members of an object the arguments' type does not declare, e.g. ignore = [\"meta.*\"]"))
}

/// Whether `path` names a field by its JSON names through objects: names joined by dots, none
/// empty, with no whitespace, quotes or brackets (an array has no field names).
fn is_field_path(path: &str) -> bool {
    path.split('.').all(|name| {
        !name.is_empty()
            && !name
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '[' | ']'))
    })
}

#[cfg(test)]
#[path = "attr_tests.rs"]
mod tests;
