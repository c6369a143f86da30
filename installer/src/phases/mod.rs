//! Deployment phases, one folder or file each; a mode is a file beside its
//! siblings (`endpoint/haproxy_keepalived.rs`, `endpoint/local_proxy.rs`).
//! (Moving the remaining phases here from `deploy.rs`, `kubeadm.rs` and
//! `addons.rs` is under way.)

pub mod endpoint;
