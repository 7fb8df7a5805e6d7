//! Which extended attributes a layer keeps, and the ones that carry ids.
//!
//! Overlayfs keeps its bookkeeping in `trusted.overlay.*` (the overlay is mounted from the
//! initial user namespace). Of those only `trusted.overlay.opaque` means something once the
//! directory is a read-only layer; the walker sets it itself. Every other `trusted.*` is
//! dropped (a sandbox cannot set them: they need `CAP_SYS_ADMIN` on the host).
//!
//! Two kinds of attribute hold host ids, read here as the host sees them:
//! - `security.capability` revision 3 (`struct vfs_ns_cap_data`, 24 bytes): `rootid` at
//!   offset 20, the host uid of the root the capabilities belong to;
//! - POSIX ACLs (`system.posix_acl_access`, `system.posix_acl_default`): a 4-byte version
//!   (2) then 8-byte entries `{tag: u16, perm: u16, id: u32}`; `ACL_USER` (2) and
//!   `ACL_GROUP` (8) entries carry a host id.
//!
//! Both are shifted like file owners. Everything else (`user.*`, other `security.*`) is copied
//! unchanged.

use super::IdShift;

/// The overlay attribute marking a directory that hides the layers below it.
pub(crate) const OPAQUE: &std::ffi::CStr = c"trusted.overlay.opaque";

const CAP: &[u8] = b"security.capability";
const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";
const VFS_CAP_REVISION_MASK: u32 = 0xFF00_0000;
const VFS_CAP_REVISION_3: u32 = 0x0300_0000;
const CAP_V3_SIZE: usize = 24;
const ACL_VERSION: u32 = 2;
const ACL_USER: u16 = 0x02;
const ACL_GROUP: u16 = 0x08;

/// The value to give attribute `name` in the layer, `None` to leave it out.
pub(crate) fn translate(name: &[u8], value: &[u8], shift: &IdShift) -> Option<Vec<u8>> {
    if name.starts_with(b"trusted.") {
        return None;
    }
    if name == CAP {
        return shift_capability(value, shift);
    }
    if name == ACL_ACCESS || name == ACL_DEFAULT {
        return shift_acl(value, shift);
    }
    Some(value.to_vec())
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Revision 3 capabilities get their `rootid` shifted; revision 2 (no id) is kept; anything
/// malformed is dropped.
fn shift_capability(value: &[u8], shift: &IdShift) -> Option<Vec<u8>> {
    let magic = u32_at(value, 0)?;
    if magic & VFS_CAP_REVISION_MASK != VFS_CAP_REVISION_3 {
        return Some(value.to_vec());
    }
    if value.len() != CAP_V3_SIZE {
        return None;
    }
    let rootid = u32_at(value, 20)?;
    let mut out = value.to_vec();
    out[20..24].copy_from_slice(&shift.map(rootid).to_le_bytes());
    Some(out)
}

/// Shift the ids of `ACL_USER` and `ACL_GROUP` entries; drop a malformed ACL.
fn shift_acl(value: &[u8], shift: &IdShift) -> Option<Vec<u8>> {
    if u32_at(value, 0)? != ACL_VERSION || !(value.len() - 4).is_multiple_of(8) {
        return None;
    }
    let mut out = value.to_vec();
    for entry in out[4..].chunks_exact_mut(8) {
        let tag = u16::from_le_bytes([entry[0], entry[1]]);
        if tag == ACL_USER || tag == ACL_GROUP {
            let id = u32::from_le_bytes([entry[4], entry[5], entry[6], entry[7]]);
            entry[4..8].copy_from_slice(&shift.map(id).to_le_bytes());
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIFT: IdShift = IdShift {
        from: 1_000_000,
        count: 65_536,
    };

    #[test]
    fn drops_overlay_bookkeeping_and_keeps_user_attributes() {
        assert_eq!(translate(b"trusted.overlay.origin", b"x", &SHIFT), None);
        assert_eq!(translate(b"trusted.overlay.opaque", b"y", &SHIFT), None);
        assert_eq!(
            translate(b"user.mime", b"text/plain", &SHIFT),
            Some(b"text/plain".to_vec())
        );
    }

    #[test]
    fn shifts_v3_capability_rootid() {
        let mut v3 = Vec::new();
        v3.extend_from_slice(&(VFS_CAP_REVISION_3 | 1).to_le_bytes());
        v3.extend_from_slice(&[0x00, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        v3.extend_from_slice(&1_000_000u32.to_le_bytes());
        let out = translate(CAP, &v3, &SHIFT).unwrap();
        assert_eq!(&out[..20], &v3[..20]);
        assert_eq!(u32_at(&out, 20), Some(0));
        // Revision 2 has no rootid and is kept as it is.
        let mut v2 = 0x0200_0001u32.to_le_bytes().to_vec();
        v2.extend_from_slice(&[0; 16]);
        assert_eq!(translate(CAP, &v2, &SHIFT), Some(v2.clone()));
        // A truncated v3 is dropped.
        assert_eq!(translate(CAP, &v3[..20], &SHIFT), None);
    }

    #[test]
    fn shifts_acl_user_and_group_entries_only() {
        let mut acl = ACL_VERSION.to_le_bytes().to_vec();
        for (tag, id) in [
            (0x01u16, u32::MAX),
            (ACL_USER, 1_001_000),
            (ACL_GROUP, 1_000_005),
            (0x04, u32::MAX),
            (ACL_USER, 5),
        ] {
            acl.extend_from_slice(&tag.to_le_bytes());
            acl.extend_from_slice(&6u16.to_le_bytes());
            acl.extend_from_slice(&id.to_le_bytes());
        }
        let out = translate(ACL_ACCESS, &acl, &SHIFT).unwrap();
        let ids: Vec<u32> = out[4..]
            .chunks_exact(8)
            .map(|e| u32::from_le_bytes([e[4], e[5], e[6], e[7]]))
            .collect();
        assert_eq!(ids, [u32::MAX, 1000, 5, u32::MAX, super::super::NOBODY]);
        assert_eq!(translate(ACL_DEFAULT, &acl[..7], &SHIFT), None);
    }
}
