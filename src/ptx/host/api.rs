//! The host engine's public face: a verified kernel decoded for the CPU
//! ([`HostKernel`]) and what a launch of one names ([`HostLaunch`]).

use super::super::{verify_kernel, Families, LaunchContract, PtxError, Signature, DAEMON_FAMILIES};
use super::{decode, exec, run};

/// One operand's memory as the host engine sees it: the address of the
/// operand's first element (buffer base + launch offset) and the bytes
/// available from there to the end of the mapping.
#[derive(Debug, Clone, Copy)]
pub struct HostSpan {
    pub ptr: *mut u8,
    pub len: usize,
}

/// A launch of a host kernel.
#[derive(Debug)]
pub struct HostLaunch<'a> {
    pub inputs: &'a [HostSpan],
    pub output: HostSpan,
    pub n: u64,
    pub params: &'a [f32],
    /// Typed by-value scalar arguments, in the order of the contract's
    /// `Scalar` params, each as its bits zero-extended to 64 (an `f32` as
    /// its `to_bits`); empty for the scalar ABI, whose scalars are `params`.
    pub args: &'a [u64],
    /// Threads of the CPU to spread the grid over.
    pub threads: usize,
    /// Bounds-check every access against the spans (KERNEL_FAULT instead of
    /// memory corruption).
    pub checked: bool,
    /// The launch's deadline and abort flag (none: it runs to the end).
    pub control: Option<&'a exec::LaunchControl>,
}

/// A fault while running a host kernel (checked mode).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("host kernel fault at line {line}: {message}")]
pub struct HostFault {
    pub line: u32,
    pub message: String,
}

/// A verified kernel decoded for the host engine.
#[derive(Debug)]
pub struct HostKernel {
    signature: Signature,
    contract: LaunchContract,
    program: decode::Program,
}

impl HostKernel {
    /// Parses, verifies and decodes `symbol` from `text`. Every instruction
    /// the engine cannot run is found here, never during a launch.
    pub fn compile(text: &str, symbol: &str) -> Result<HostKernel, PtxError> {
        HostKernel::compile_with(text, symbol, DAEMON_FAMILIES)
    }

    /// [`HostKernel::compile`], accepting `families`.
    pub fn compile_with(
        text: &str,
        symbol: &str,
        families: Families,
    ) -> Result<HostKernel, PtxError> {
        let (kernel, verified) = verify_kernel(text, symbol, None, families)?;
        let program = decode::decode(&kernel, &verified.contract)?;
        Ok(HostKernel {
            signature: verified.signature,
            contract: verified.contract,
            program,
        })
    }

    /// The kernel's verified signature.
    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    /// The kernel's launch contract.
    pub fn contract(&self) -> &LaunchContract {
        &self.contract
    }

    /// Runs the kernel over `n` elements with the CUDA launch geometry.
    ///
    /// # Safety
    /// Each span must be valid for reads (inputs) or writes (output) of
    /// `len` bytes for the duration of the call.
    pub unsafe fn launch(&self, launch: &HostLaunch<'_>) -> Result<(), HostFault> {
        // SAFETY: the caller upholds the span validity `launch_filled` needs.
        unsafe { self.launch_filled(launch, 0) }
    }

    /// [`HostKernel::launch`] with every register starting at `fill`
    /// instead of 0: the check that a verified kernel reads no register it
    /// never wrote (on a GPU such a register holds what the previous
    /// kernel left there), since its output cannot then depend on `fill`.
    /// The mutant oracles (`tests/support/mutants.rs`) run each accepted
    /// mutant under two fills and compare.
    ///
    /// # Safety
    /// As [`HostKernel::launch`].
    pub unsafe fn launch_filled(
        &self,
        launch: &HostLaunch<'_>,
        fill: u64,
    ) -> Result<(), HostFault> {
        // The contract's preconditions hold here too, whoever launches: the
        // proof of a 32-bit index assumed them.
        let values = self.contract.values(launch.n, self.block_size());
        if let Some(p) = self
            .contract
            .preconditions
            .iter()
            .find(|p| !p.holds_with(&values, launch.args))
        {
            let names = self.contract.arg_names();
            return Err(HostFault {
                line: 0,
                message: format!(
                    "precondition {} does not hold at {}",
                    p.text(&names),
                    p.values_with(&values, launch.args, &names)
                ),
            });
        }
        // SAFETY: the caller upholds the span validity `run` needs.
        unsafe { run(&self.program, &self.contract, launch, fill) }
    }

    /// The block size launches use: the contract's block rule on the host.
    pub fn block_size(&self) -> u32 {
        self.contract.geometry.block.host_block()
    }

    /// Test support only: decodes `symbol` in `text` with a hand-written
    /// `contract` and NO verification, for kernels whose family the
    /// verifier does not prove yet. The signature is read off the contract.
    #[cfg(test)]
    pub(crate) fn unverified_for_tests(
        text: &str,
        symbol: &str,
        contract: LaunchContract,
    ) -> Result<HostKernel, PtxError> {
        use super::super::contract::BlockRule;
        let kernel = super::super::lower(text, symbol)?;
        let program = decode::decode(&kernel, &contract)?;
        let (reqntid, maxntid) = match contract.geometry.block {
            BlockRule::Required(x) => (Some(x), None),
            BlockRule::AtMost(x) => (None, Some(x)),
            BlockRule::Default => (None, None),
        };
        let signature = Signature {
            inputs: u32::try_from(contract.inputs()).unwrap_or(u32::MAX),
            element_sizes: contract.footprints.iter().map(|f| f.alignment).collect(),
            scalar_params: u32::try_from(contract.scalar_params()).unwrap_or(u32::MAX),
            reqntid,
            maxntid,
        };
        Ok(HostKernel {
            signature,
            contract,
            program,
        })
    }
}
