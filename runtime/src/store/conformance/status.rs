//! Status lookups: tenant and subject scope, exact generations.

use super::fixtures::*;
use super::subject::*;
use crate::key::Key;
use crate::store::{Claim, ClaimRequest, RecordState, RecordStatus, StoreError};

// ---------------------------------------------------------------------------------------------
// Status
// ---------------------------------------------------------------------------------------------

pub(super) async fn status_is_tenant_scoped_and_generation_exact(b: &Subject) {
    let k = key("status");
    let t = b.new_claim(k, None, 0).await;
    b.complete(k, t, S, "done")
        .await
        .expect("expected the completion to apply");
    assert_eq!(
        b.status(TENANT, k.reference(1)).await,
        Some(RecordStatus {
            reference: k.reference(1),
            tool: TOOL.into(),
            state: RecordState::Completed,
            claimed_at: at(0),
            lease_expires_at: at(S), // the lease ended when it completed
            completed_at: Some(at(S)),
            expires_at: Some(at(S + WINDOW)),
            response: Some(answer("done")),
            read_at: None, // the store trusts the engine's clock here
        })
    );
    assert_eq!(
        b.status("globex", k.reference(1)).await,
        None,
        "another tenant's reference"
    );
    assert_eq!(
        b.status(TENANT, k.reference(2)).await,
        None,
        "a generation that does not exist"
    );
    assert_eq!(b.status(TENANT, key("never").reference(1)).await, None);
    b.new_claim(k, None, S + WINDOW).await;
    assert_eq!(
        b.status(TENANT, k.reference(1)).await.map(|s| s.reference),
        Some(k.reference(2)),
        "a superseded generation: the current record, under its own ref"
    );
    assert_eq!(
        b.status(TENANT, k.reference(2)).await.map(|s| s.state),
        Some(RecordState::InFlight)
    );

    // Two keys sharing the 8-byte prefix (so one reference): the reference names one record,
    // so the second key is refused, whatever the first record's state or tenant, until purged.
    let mut bytes = [0x5au8; 32];
    let ka = Key::from_bytes(bytes);
    bytes[31] = 0x5b;
    let kb = Key::from_bytes(bytes);
    assert_eq!(ka.reference(1), kb.reference(1));
    let claim = |key, tenant, tool, now| ClaimRequest {
        key,
        tenant,
        subject: None,
        tool,
        fingerprint: None,
        now: at(now),
        lease: dur(LEASE),
        window: std::time::Duration::from_millis(WINDOW as u64),
        token: first_token(now),
    };
    let ta = match b.store.claim(&claim(ka, "acme", "charge_card", 0)).await {
        Ok(Claim::New { token, .. }) => token,
        other => panic!("{other:?}"),
    };
    let taken = |r: Result<Claim, StoreError>| match r {
        Err(StoreError::ReferenceTaken { reference }) => reference,
        other => panic!("expected ReferenceTaken, got {other:?}"),
    };
    let in_flight = taken(
        b.store
            .claim(&claim(kb, "globex", "create_shipment", S))
            .await,
    );
    assert_eq!(in_flight, ka.reference(1));
    b.complete(ka, ta, S, "done")
        .await
        .expect("expected the completion to apply");
    taken(
        b.store
            .claim(&claim(kb, "acme", "charge_card", 2 * S))
            .await,
    );
    let expired = taken(
        b.store
            .claim(&claim(kb, "acme", "charge_card", S + WINDOW))
            .await,
    );
    assert_eq!(
        expired,
        ka.reference(1),
        "an expired record still holds its reference"
    );
    assert_eq!(
        b.status("acme", ka.reference(1)).await.map(|s| s.tool),
        Some("charge_card".into())
    );
    assert_eq!(b.status("globex", ka.reference(1)).await, None);
    assert_eq!(
        b.store
            .purge(at(2 * (S + WINDOW)), at(2 * (S + WINDOW)), 10)
            .await
            .expect("expected the purge to succeed"),
        1
    );
    assert!(
        matches!(
            b.store
                .claim(&claim(kb, "globex", "create_shipment", 2 * (S + WINDOW)))
                .await,
            Ok(Claim::New { .. })
        ),
        "a purged record frees its reference"
    );
    assert_eq!(
        b.status("globex", kb.reference(1)).await.map(|s| s.tool),
        Some("create_shipment".into())
    );
}
