//! The README's complete server ("A complete server"): `server.rs`, which is that README block
//! byte for byte (`tests/readme.rs` checks it), so it has no room for this crate's doc.

include!("server.rs");
