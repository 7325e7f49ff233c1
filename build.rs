//! Generates Karmada's scheduler-estimator messages and server trait from `proto/` (see
//! proto/README.md). protox parses the files in Rust, so the build needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = protox::compile(["pkg/estimator/service/service.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .include_file("estimator_protos.rs")
        .compile_fds(files)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
