//! `disk_mib` on `vm`: a sandbox's root disk is at least the size it asked for.
//!
//! Every guest is restored from a snapshot whose disk is the template image's size (its files
//! plus 1 GiB free). When `disk_mib` asks for more, the host grows the restored guest's
//! overlay with QMP `block_resize` (the guest kernel learns the new capacity through a virtio
//! config change) and the identity call tells the agent to grow the mounted ext4 online
//! (`IdentityRequest::root_disk_bytes`). A disk cannot shrink: asking for less than the
//! image keeps the image's size, and the sandbox reports the size it got.

/// The `-drive id=` of the root disk on QEMU's command line (`hutch_vm::qemu`).
pub(super) const ROOT_DRIVE: &str = "root";

/// What the root disk of a sandbox asking for `disk_mib` becomes, when it has
/// `current_bytes` now: the bytes to grow it to (`None`: keep it), and its size in MiB.
pub(super) fn plan(disk_mib: u64, current_bytes: u64) -> (Option<u64>, u64) {
    let wanted = disk_mib.saturating_mul(1 << 20);
    if wanted > current_bytes {
        (Some(wanted), disk_mib)
    } else {
        (None, current_bytes >> 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disks_grow_but_never_shrink() {
        let image = 1029 << 20;
        assert_eq!(plan(2048, image), (Some(2048 << 20), 2048));
        assert_eq!(plan(512, image), (None, 1029));
        assert_eq!(plan(1029, image), (None, 1029));
        // A bigger disk (a fork child of a grown parent) is kept as it is.
        assert_eq!(plan(1024, 4096 << 20), (None, 4096));
    }
}
