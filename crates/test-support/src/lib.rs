//! Test tooling shared by the workspace's test suites (the service's, the lab's): the built
//! binaries run as a user runs them, loopback ports, the Kubernetes binaries, the one driver of
//! the loopback control plane and the extender process, a plain HTTP client and Prometheus text
//! readers. Test code and the lab only: the service never depends on it.

pub mod bins;
pub mod cli;
pub mod http;
pub mod image;
pub mod metrics;
pub mod plane;
pub mod port;
