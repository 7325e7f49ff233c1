//! Generates Rust from `proto/` (see proto/README.md): Karmada's scheduler-estimator messages and
//! server trait, and the Pod view the protobuf watch decodes. protox parses the files in Rust, so
//! the build needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let estimator = protox::compile(["pkg/estimator/service/service.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .include_file("estimator_protos.rs")
        .compile_fds(estimator)?;
    let pod_watch = protox::compile(["gpu_extender/pod_watch.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .include_file("pod_watch_protos.rs")
        .compile_fds(pod_watch)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
