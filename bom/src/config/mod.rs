//! The cluster.yaml config: model, defaults, loading and validation.

pub mod bastion;
pub mod conformance;
pub mod defaults;
pub mod grammar;
pub mod host_paths;
pub mod load;
pub mod model;
pub mod registry_auth;
mod secret;
pub mod support;
pub mod untrusted;
pub mod validate;

pub use load::{LoadError, MAX_CONFIG_BYTES, MAX_HOSTS, Origin, load_file, load_file_hosts, load_str, load_str_as, load_str_hosts};
pub use model::Cluster;
