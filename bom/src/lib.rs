//! kubexm-bom: the cluster.yaml model, its validation, the component
//! catalog, and resolution of a config into a bill of materials.
//!
//! Data flows one way: text → [`config::load_str`] (every problem reported
//! at once, with line:column) → a completed [`config::Cluster`] →
//! [`resolve::resolve`] with a [`catalog::Catalog`] → a deterministic [`Bom`].
//! Nothing here fetches anything; the only I/O is reading files.

pub mod addons;
mod bom;
pub mod catalog;
pub mod changes;
pub mod config;
pub mod diag;
pub mod image;
pub mod mirror;
pub mod net;
pub mod record;
pub mod resolve;
pub mod text;
pub mod topology;
pub mod upgrade;
pub mod yaml;

pub use bom::{Bom, ChartItem, ChartSource, Checksum, DebItem, FileItem, ImageItem, ManifestItem, OsRepoItem};
