//! Tests of `check.rs`.

use super::*;

#[test]
fn paths_overlap_when_one_holds_the_other() {
    assert!(overlaps("meta", "meta"));
    assert!(overlaps("meta", "meta.request_id"));
    assert!(overlaps("meta.request_id", "meta"));
    assert!(!overlaps("meta", "metadata"));
    assert!(!overlaps("meta.request_id", "meta.request"));
    assert!(!overlaps("meta.a", "meta.b"));
}
