//! ptxd's wire format: the public `ptxd.v1` gRPC API and the internal
//! `ptxd.executor.v1` protocol between the front and its executor processes.
//!
//! The code is generated at build time from the `.proto` files beside this
//! crate (see `build.rs`); this crate holds nothing else but the few
//! conversions every user of the wire format needs.

#![allow(missing_debug_implementations, clippy::all)]
// The generated docs are the .proto comments, which write placeholders such
// as `HOST-<n>` and `[...]` as plain text, not HTML or links.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]

/// The public API, package `ptxd.v1`.
pub mod v1 {
    tonic::include_proto!("ptxd.v1");

    impl Reason {
        /// The reason's name as carried in `google.rpc.ErrorInfo.reason`:
        /// the enum value's name without the `REASON_` prefix.
        pub fn wire_name(self) -> &'static str {
            let name = self.as_str_name();
            name.strip_prefix("REASON_").unwrap_or(name)
        }

        /// The reason for a wire name (the inverse of [`Reason::wire_name`]).
        pub fn from_wire_name(name: &str) -> Option<Self> {
            Self::from_str_name(&format!("REASON_{name}"))
        }
    }
}

/// The internal executor protocol, package `ptxd.executor.v1`.
pub mod executor {
    tonic::include_proto!("ptxd.executor.v1");
}

/// The kubelet's device-plugin API, `k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1`
/// (package `v1beta1`), vendored in `k8s/deviceplugin/v1beta1/api.proto`.
pub mod deviceplugin {
    pub mod v1beta1 {
        tonic::include_proto!("v1beta1");

        /// The API version a plugin registers with.
        pub const VERSION: &str = "v1beta1";
        /// A device's health, as `Device.health` carries it.
        pub const HEALTHY: &str = "Healthy";
        /// A device's health, as `Device.health` carries it.
        pub const UNHEALTHY: &str = "Unhealthy";
        /// Where the kubelet expects plugin sockets, and its own.
        pub const DEVICE_PLUGIN_PATH: &str = "/var/lib/kubelet/device-plugins";
        /// The kubelet's registration socket, in [`DEVICE_PLUGIN_PATH`].
        pub const KUBELET_SOCKET: &str = "kubelet.sock";
    }
}

/// The encoded `FileDescriptorSet` that gRPC reflection serves: `ptxd.v1`
/// plus `google/rpc/error_details.proto` and its imports.
pub const REFLECTION_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/ptxd_reflection.bin"));

/// The domain of every `google.rpc.ErrorInfo` ptxd sends.
pub const ERROR_DOMAIN: &str = "ptxd";

/// The fully qualified name of the gRPC service, as health checks name it.
pub const SERVICE_NAME: &str = "ptxd.v1.Ptxd";

#[cfg(test)]
mod tests {
    use super::v1::Reason;

    #[test]
    fn every_reason_round_trips_its_wire_name() {
        for value in 1..=26 {
            let reason = Reason::try_from(value).unwrap_or(Reason::Unspecified);
            assert_ne!(reason, Reason::Unspecified, "value {value} has no reason");
            assert_eq!(Reason::from_wire_name(reason.wire_name()), Some(reason));
            assert!(!reason.wire_name().starts_with("REASON_"));
        }
    }
}
