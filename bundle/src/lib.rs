//! kubexm-bundle: the artifact format both sides share.
//!
//! A bundle is one deterministic `.tar.zst`. Its first member, `bundle.yaml`
//! ([`manifest::BundleManifest`]), carries the digest-pinned BOM (the lock)
//! and the sha256 and size of every other member, so a reader can check each
//! member while it streams past, before it ever meets one it does not expect.
//! Beside it, `<bundle>.minisig` is a minisign signature of the whole archive,
//! checkable with the `minisign` CLI.
//!
//! The builder writes bundles with [`pack`]; the installer and
//! `kubexm-bundle verify` read them with [`verify`].

pub mod diff;
pub mod digest;
pub mod files;
pub mod layout;
pub mod manifest;
pub mod pack;
pub mod sbom;
mod tar_guard;
#[doc(hidden)]
pub mod testing;
mod trusted_comment;
pub mod verify;

/// Where the installer unpacks bundles: `<BUNDLES_DIR>/<bundle-digest>/`.
pub const BUNDLES_DIR: &str = "/var/lib/kubexm/bundles";
/// The installer's state database.
pub const STATE_DB: &str = "/var/lib/kubexm/state.db";
/// The CAs the installer generates, mode 0700.
pub const PKI_DIR: &str = "/var/lib/kubexm/pki";
