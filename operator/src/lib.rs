//! kubexm's operator side (issue 31): the `Cluster` custom resource
//! (`clusters.kubexm.io`, v1alpha1), whose `spec` is cluster.yaml's body,
//! generated from the same Rust model. Its controller, a trigger of the same
//! operations as the CLI and the API server's workers, comes next; see
//! docs/architecture.md.

pub mod crd;
