//! The attribute's options, parsed into a typed model. Each option is stored by one setter, which
//! rejects a duplicate; every error is collected and reported together.

use proc_macro2::Span;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprArray, ExprLit, Lit, LitStr, Meta, Token};

use crate::ctxt::Ctxt;

pub const OPTIONS: &str = "window, business_key, name, on_error, timeout, context, crate";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnError {
    Retryable,
    Definitive,
    Unknown,
}

/// A duration option: its value in milliseconds and the literal it came from.
#[derive(Clone)]
pub struct DurationOpt {
    pub millis: u64,
}

/// One business-key path (`order.id` → ["order", "id"]), with the literal's span.
#[derive(Clone)]
pub struct KeyPath {
    pub segments: Vec<String>,
    pub span: Span,
}

#[derive(Default)]
pub struct Options {
    pub window: Option<DurationOpt>,
    pub business_key: Option<Vec<KeyPath>>,
    pub name: Option<LitStr>,
    pub on_error: Option<OnError>,
    pub timeout: Option<DurationOpt>,
    pub context: Option<LitStr>,
    pub krate: Option<syn::Path>,
}

/// The default window when none is given.
pub const DEFAULT_WINDOW_MS: u64 = 15 * 60 * 1000;

fn set<T>(cx: &mut Ctxt, slot: &mut Option<T>, value: T, name: &str, span: Span) {
    if slot.is_some() {
        cx.error(span, format!("duplicate option `{name}`"));
    } else {
        *slot = Some(value);
    }
}

fn lit_str(cx: &mut Ctxt, expr: &Expr, name: &str) -> Option<LitStr> {
    match expr {
        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => Some(s.clone()),
        other => {
            cx.error(other.span(), format!("`{name}` takes a string, e.g. {name} = \"...\""));
            None
        }
    }
}

/// "15m" → 900_000. Units: ms, s, m, h, d. Zero and overflow are errors.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    const HELP: &str = "expected a positive whole number and a unit: \"500ms\", \"30s\", \"15m\", \"2h\" or \"1d\"";
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return Err(format!("`{s}` is not a duration: {HELP}"));
    }
    let factor: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("`{s}` has an unknown unit `{unit}`: {HELP}")),
    };
    let n: u64 = digits.parse().map_err(|_| format!("`{s}` is too large"))?;
    if n == 0 {
        return Err(format!("`{s}` is zero: a window or timeout must be positive"));
    }
    n.checked_mul(factor)
        .ok_or_else(|| format!("`{s}` is too large"))
}

fn duration(cx: &mut Ctxt, expr: &Expr, name: &str) -> Option<DurationOpt> {
    let lit = lit_str(cx, expr, name)?;
    match parse_duration(&lit.value()) {
        Ok(millis) => Some(DurationOpt { millis }),
        Err(e) => {
            cx.error(lit.span(), e);
            None
        }
    }
}

fn key_path(cx: &mut Ctxt, lit: &LitStr) -> Option<KeyPath> {
    let value = lit.value();
    let segments: Vec<String> = value.split('.').map(|s| s.trim().to_owned()).collect();
    if segments.iter().any(|s| syn::parse_str::<syn::Ident>(s).is_err() && s.parse::<usize>().is_err()) {
        cx.error(lit.span(), format!("`{value}` is not a field path: expected `field` or `field.nested`"));
        return None;
    }
    Some(KeyPath { segments, span: lit.span() })
}

impl Options {
    pub fn parse(cx: &mut Ctxt, tokens: proc_macro2::TokenStream) -> Options {
        let mut opts = Options::default();
        let metas = match Punctuated::<Meta, Token![,]>::parse_terminated.parse2(tokens) {
            Ok(m) => m,
            Err(e) => {
                cx.push(e);
                return opts;
            }
        };
        for meta in metas {
            let Meta::NameValue(nv) = &meta else {
                cx.error(meta.span(), format!("expected `option = \"value\"`; valid options: {OPTIONS}"));
                continue;
            };
            let name = nv.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
            let span = nv.path.span();
            match name.as_str() {
                "window" => {
                    if let Some(d) = duration(cx, &nv.value, "window") {
                        set(cx, &mut opts.window, d, "window", span);
                    }
                }
                "timeout" => {
                    if let Some(d) = duration(cx, &nv.value, "timeout") {
                        set(cx, &mut opts.timeout, d, "timeout", span);
                    }
                }
                "business_key" => {
                    let paths = match &nv.value {
                        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => key_path(cx, s).map(|p| vec![p]),
                        Expr::Array(ExprArray { elems, .. }) if !elems.is_empty() => {
                            let mut v = Vec::new();
                            for e in elems {
                                if let Some(s) = lit_str(cx, e, "business_key") {
                                    v.extend(key_path(cx, &s));
                                }
                            }
                            Some(v)
                        }
                        other => {
                            cx.error(other.span(), "`business_key` takes a field name, a path \"order.id\", or a list [\"a\", \"b\"]");
                            None
                        }
                    };
                    if let Some(p) = paths {
                        set(cx, &mut opts.business_key, p, "business_key", span);
                    }
                }
                "name" => {
                    if let Some(s) = lit_str(cx, &nv.value, "name") {
                        if s.value().is_empty() {
                            cx.error(s.span(), "the tool name must not be empty");
                        }
                        set(cx, &mut opts.name, s, "name", span);
                    }
                }
                "context" => {
                    if let Some(s) = lit_str(cx, &nv.value, "context") {
                        set(cx, &mut opts.context, s, "context", span);
                    }
                }
                "on_error" => {
                    if let Some(s) = lit_str(cx, &nv.value, "on_error") {
                        let d = match s.value().as_str() {
                            "retryable" => Some(OnError::Retryable),
                            "definitive" => Some(OnError::Definitive),
                            "unknown" => Some(OnError::Unknown),
                            other => {
                                cx.error(s.span(), format!("`{other}` is not a disposition: expected \"retryable\", \"definitive\" or \"unknown\""));
                                None
                            }
                        };
                        if let Some(d) = d {
                            set(cx, &mut opts.on_error, d, "on_error", span);
                        }
                    }
                }
                "crate" => {
                    if let Some(s) = lit_str(cx, &nv.value, "crate") {
                        match s.parse::<syn::Path>() {
                            Ok(p) => set(cx, &mut opts.krate, p, "crate", span),
                            Err(_) => cx.error(s.span(), "`crate` takes a path, e.g. crate = \"::idempotency\""),
                        }
                    }
                }
                other => cx.error(span, format!("unknown option `{other}`; valid options: {OPTIONS}")),
            }
        }
        opts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15m"), Ok(900_000));
        assert_eq!(parse_duration("500ms"), Ok(500));
        assert_eq!(parse_duration("1d"), Ok(86_400_000));
        assert!(parse_duration("15x").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("99999999999999999999h").is_err());
        assert!(parse_duration("9999999999999999d").is_err());
    }

    proptest::proptest! {
        #[test]
        fn duration_parser_never_panics(s in "\\PC{0,12}") {
            let _ = parse_duration(&s);
        }

        #[test]
        fn option_parser_never_panics(s in "[a-z_=\", \\[\\]0-9.:]{0,40}") {
            let mut cx = Ctxt::default();
            if let Ok(ts) = s.parse::<proc_macro2::TokenStream>() {
                let _ = Options::parse(&mut cx, ts);
            }
        }
    }
}
