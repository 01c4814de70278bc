//! The session binding's unit tests.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

fn alice() -> Caller {
    Caller::new("acme", "alice")
}
fn bob() -> Caller {
    Caller::new("globex", "bob")
}

fn request(method: Method, caller: Option<Caller>, session: Option<&str>) -> Request<()> {
    let mut r = Request::new(());
    *r.method_mut() = method;
    if let Some(c) = caller {
        r.extensions_mut().insert(c);
    }
    if let Some(s) = session {
        r.headers_mut()
            .insert(SESSION_HEADER, HeaderValue::from_str(s).unwrap());
    }
    r
}

fn answer(status: StatusCode, session: Option<&str>) -> Response<String> {
    let mut r = Response::new("from rmcp".to_owned());
    *r.status_mut() = status;
    if let Some(s) = session {
        r.headers_mut()
            .insert(SESSION_HEADER, HeaderValue::from_str(s).unwrap());
    }
    r
}

/// Runs one request through the guard; `rmcp` answers `answered` (see [`answer`]) and counts
/// the requests that reached it.
async fn send(
    sessions: &CallerBoundSessions,
    reached: &AtomicUsize,
    req: Request<()>,
    answered: Response<String>,
) -> Response<String> {
    sessions
        .guard(req, |_| async {
            reached.fetch_add(1, Ordering::SeqCst);
            answered
        })
        .await
}

#[tokio::test]
async fn only_the_opener_may_use_a_session_and_refusals_look_alike() {
    let s = CallerBoundSessions::new();
    let reached = AtomicUsize::new(0);
    let opened = send(
        &s,
        &reached,
        request(Method::POST, Some(alice()), None),
        answer(StatusCode::OK, Some("s-1")),
    )
    .await;
    assert_eq!(opened.status(), StatusCode::OK);
    for method in [Method::POST, Method::GET, Method::DELETE] {
        let theirs = send(
            &s,
            &reached,
            request(method.clone(), Some(bob()), Some("s-1")),
            answer(StatusCode::OK, None),
        )
        .await;
        let unknown = send(
            &s,
            &reached,
            request(method.clone(), Some(bob()), Some("s-404")),
            answer(StatusCode::OK, None),
        )
        .await;
        let anonymous = send(
            &s,
            &reached,
            request(method, None, Some("s-1")),
            answer(StatusCode::OK, None),
        )
        .await;
        for r in [&theirs, &unknown, &anonymous] {
            assert_eq!(r.status(), StatusCode::FORBIDDEN);
            assert_eq!(r.body(), REFUSAL);
            assert_eq!(r.headers(), theirs.headers());
        }
    }
    assert_eq!(reached.load(Ordering::SeqCst), 1, "no refusal reached rmcp");
    // Bob's DELETE did not end it: Alice still gets through.
    let mine = send(
        &s,
        &reached,
        request(Method::GET, Some(alice()), Some("s-1")),
        answer(StatusCode::OK, None),
    )
    .await;
    assert_eq!(mine.status(), StatusCode::OK);
    assert_eq!(reached.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_same_tenant_with_another_subject_is_another_caller() {
    let s = CallerBoundSessions::new();
    let reached = AtomicUsize::new(0);
    send(
        &s,
        &reached,
        request(Method::POST, Some(alice()), None),
        answer(StatusCode::OK, Some("s-1")),
    )
    .await;
    let colleague = send(
        &s,
        &reached,
        request(
            Method::POST,
            Some(Caller::new("acme", "carol")),
            Some("s-1"),
        ),
        answer(StatusCode::OK, None),
    )
    .await;
    assert_eq!(colleague.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_request_without_a_caller_is_refused_even_without_a_session() {
    let s = CallerBoundSessions::new();
    let reached = AtomicUsize::new(0);
    let r = send(
        &s,
        &reached,
        request(Method::POST, None, None),
        answer(StatusCode::OK, Some("s-1")),
    )
    .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(reached.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_repeated_session_header_is_refused() {
    let s = CallerBoundSessions::new();
    let reached = AtomicUsize::new(0);
    send(
        &s,
        &reached,
        request(Method::POST, Some(alice()), None),
        answer(StatusCode::OK, Some("s-1")),
    )
    .await;
    let mut twice = request(Method::POST, Some(alice()), Some("s-1"));
    twice
        .headers_mut()
        .append(SESSION_HEADER, HeaderValue::from_static("s-2"));
    let r = send(&s, &reached, twice, answer(StatusCode::OK, None)).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(reached.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_owners_delete_and_an_ended_session_unbind_it() {
    let s = CallerBoundSessions::new();
    let reached = AtomicUsize::new(0);
    for id in ["s-1", "s-2"] {
        send(
            &s,
            &reached,
            request(Method::POST, Some(alice()), None),
            answer(StatusCode::OK, Some(id)),
        )
        .await;
    }
    // A failed DELETE keeps the binding; a successful one removes it.
    let failed = send(
        &s,
        &reached,
        request(Method::DELETE, Some(alice()), Some("s-1")),
        answer(StatusCode::INTERNAL_SERVER_ERROR, None),
    )
    .await;
    assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let deleted = send(
        &s,
        &reached,
        request(Method::DELETE, Some(alice()), Some("s-1")),
        answer(StatusCode::ACCEPTED, None),
    )
    .await;
    assert_eq!(deleted.status(), StatusCode::ACCEPTED);
    // rmcp says s-2 has ended (404): the owner hears it once, then the id is unknown.
    let ended = send(
        &s,
        &reached,
        request(Method::POST, Some(alice()), Some("s-2")),
        answer(StatusCode::NOT_FOUND, None),
    )
    .await;
    assert_eq!(ended.status(), StatusCode::NOT_FOUND);
    for id in ["s-1", "s-2"] {
        let after = send(
            &s,
            &reached,
            request(Method::POST, Some(alice()), Some(id)),
            answer(StatusCode::OK, None),
        )
        .await;
        assert_eq!(after.status(), StatusCode::FORBIDDEN, "{id}");
    }
    assert_eq!(reached.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn an_issued_id_is_never_rebound_to_another_caller() {
    let s = CallerBoundSessions::new();
    let reached = AtomicUsize::new(0);
    for who in [alice(), bob()] {
        send(
            &s,
            &reached,
            request(Method::POST, Some(who), None),
            answer(StatusCode::OK, Some("s-1")),
        )
        .await;
    }
    let bobs = send(
        &s,
        &reached,
        request(Method::POST, Some(bob()), Some("s-1")),
        answer(StatusCode::OK, None),
    )
    .await;
    assert_eq!(bobs.status(), StatusCode::FORBIDDEN);
}

#[tokio::test(start_paused = true)]
async fn idle_bindings_are_forgotten_and_used_ones_kept() {
    let s = CallerBoundSessions::forget_after(Duration::from_secs(600));
    let reached = AtomicUsize::new(0);
    for id in ["busy", "idle"] {
        send(
            &s,
            &reached,
            request(Method::POST, Some(alice()), None),
            answer(StatusCode::OK, Some(id)),
        )
        .await;
    }
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(300)).await;
        let r = send(
            &s,
            &reached,
            request(Method::POST, Some(alice()), Some("busy")),
            answer(StatusCode::OK, None),
        )
        .await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    // A new binding sweeps: "idle" (900 s unused) goes, "busy" (just used) stays.
    send(
        &s,
        &reached,
        request(Method::POST, Some(bob()), None),
        answer(StatusCode::OK, Some("new")),
    )
    .await;
    assert!(!s.lock().owners.contains_key("idle"));
    assert!(s.lock().owners.contains_key("busy"));
    let idle = send(
        &s,
        &reached,
        request(Method::POST, Some(alice()), Some("idle")),
        answer(StatusCode::OK, None),
    )
    .await;
    assert_eq!(idle.status(), StatusCode::FORBIDDEN);
}
