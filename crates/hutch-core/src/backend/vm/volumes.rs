//! Volumes of `vm` sandboxes.
//!
//! A guest cannot be given new devices after its restore (microvm has no hotplug), and a
//! restore's device set must be the bake's. So every guest has the same
//! [`hutch_vm::qemu::VOLUME_SLOTS`] `virtio-blk` slots, empty in every bake. A volume is
//! attached by restoring with the volume's ext4 image in a slot; the agent then makes the
//! guest probe that disk again and mounts it (`hutch-agent`'s `volumes.rs`).
//!
//! What each slot holds in a guest's memory is its **layout**. A template's bake has every
//! slot empty. A memory snapshot records the layout of the guest it was taken of
//! ([`LAYOUT_FILE`]), because a guest restored from it still has those volumes mounted:
//!
//! - a fork child keeps its parent's read-only volumes in their slots, mounted as they were
//!   (the parent holds them read-only all along, so the guest's page cache is still true);
//! - every other volume of the snapshot is **dropped**: the agent detaches its mount point
//!   and the slot holds an empty read-only disk (a read-write volume stays its parent's;
//!   a volume the snapshot had may have changed since, so its cached pages are not trusted);
//! - the sandbox's other volumes go to slots that are empty in the layout.
//!
//! The layout of a sandbox is a function of its record and its snapshot's layout, so a
//! wake (a restore of its own hibernated memory) attaches the same images to the same slots.

use std::path::{Path, PathBuf};

use hutch_proto::GuestVolume;
use hutch_vm::qemu::{volume_serial, VolumeDrive, VOLUME_SLOTS};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::error::{CoreError, CoreResult};
use crate::model::SandboxRecord;
use crate::volume::VolumeMount;

/// A memory snapshot's layout, beside its state.
pub(super) const LAYOUT_FILE: &str = "volume-slots.json";

/// What a volume slot holds in a guest's memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "slot", rename_all = "snake_case")]
pub(super) enum Slot {
    /// Never used: the guest sees an empty disk.
    #[default]
    Empty,
    /// A volume, mounted at `path`.
    Volume {
        /// `vol_…`.
        volume: String,
        /// Mount point in the guest.
        path: String,
        /// Attached read-only.
        read_only: bool,
    },
    /// A volume an ancestor had, detached: unusable for good (the guest's kernel may still
    /// hold its filesystem for processes with files open there).
    Dropped,
}

/// What a restore attaches and what the agent does about it.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// The guest's layout once the agent is done.
    pub slots: Vec<Slot>,
    /// QEMU's drives, by slot.
    pub drives: [Option<VolumeDrive>; VOLUME_SLOTS],
    /// Mount points the agent detaches.
    pub unmount: Vec<String>,
    /// Disks the agent probes again and mounts.
    pub mount: Vec<GuestVolume>,
}

/// The layout of the guest `r` is restored from (its snapshot's, or the bake's: all empty).
fn source_layout(cfg: &Config, r: &SandboxRecord) -> CoreResult<Vec<Slot>> {
    let Some(layer) = &r.layer else {
        return Ok(vec![Slot::Empty; VOLUME_SLOTS]);
    };
    let file = cfg.snapshot_dir(layer).join(LAYOUT_FILE);
    match std::fs::read(&file) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|source| CoreError::Decode { path: file, source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(vec![Slot::Empty; VOLUME_SLOTS]),
        Err(e) => Err(CoreError::io("read", file)(e)),
    }
}

/// The plan for restoring `r` (see the module's rules).
pub(super) fn plan(cfg: &Config, r: &SandboxRecord) -> CoreResult<Plan> {
    let source = source_layout(cfg, r)?;
    let keep_read_only = r.forked_from.is_some();
    let mut p = assign(&source, &r.volumes, keep_read_only)?;
    for (slot, used) in p.slots.iter().enumerate() {
        p.drives[slot] = match used {
            Slot::Volume {
                volume, read_only, ..
            } => Some(VolumeDrive {
                image: image_of(cfg, volume),
                read_only: *read_only,
            }),
            Slot::Empty | Slot::Dropped => None,
        };
    }
    Ok(p)
}

/// The image of volume `id`.
pub(super) fn image_of(cfg: &Config, id: &str) -> PathBuf {
    cfg.volume_dir(id).join("disk.ext4")
}

/// Lay `wanted` out over `source` (pure: the rules of the module).
fn assign(source: &[Slot], wanted: &[VolumeMount], keep_read_only: bool) -> CoreResult<Plan> {
    let mut p = Plan {
        slots: source.to_vec(),
        ..Plan::default()
    };
    p.slots.resize(VOLUME_SLOTS, Slot::Dropped);
    let mut placed = vec![false; wanted.len()];
    for slot in p.slots.iter_mut() {
        let Slot::Volume {
            volume,
            path,
            read_only,
        } = slot
        else {
            continue;
        };
        let kept = keep_read_only
            && *read_only
            && wanted.iter().enumerate().any(|(i, m)| {
                let same = m.read_only && &m.volume == volume && &m.path == path && !placed[i];
                if same {
                    placed[i] = true;
                }
                same
            });
        if !kept {
            p.unmount.push(path.clone());
            *slot = Slot::Dropped;
        }
    }
    for (m, _) in wanted.iter().zip(&placed).filter(|(_, done)| !**done) {
        let free = p
            .slots
            .iter()
            .position(|s| *s == Slot::Empty)
            .ok_or_else(|| {
                CoreError::InvalidArgument(format!(
                    "no free volume slot for {} at {}: a vm sandbox has {VOLUME_SLOTS} slots, and \
                 those its snapshot's guest used for other volumes stay taken",
                    m.volume, m.path
                ))
            })?;
        p.slots[free] = Slot::Volume {
            volume: m.volume.clone(),
            path: m.path.clone(),
            read_only: m.read_only,
        };
        p.mount.push(GuestVolume {
            serial: volume_serial(free),
            path: m.path.clone(),
            read_only: m.read_only,
        });
    }
    Ok(p)
}

/// Let the sandbox's QEMU (running as `uid`) open its volumes' images: a read-write one is
/// handed to that uid alone, a read-only one belongs to root and is readable (QEMU sees
/// only the images bound into its jail, read-only ones through a read-only bind).
pub(super) fn grant(plan: &Plan, uid: u32) -> CoreResult<()> {
    use std::os::unix::fs::PermissionsExt;
    for drive in plan.drives.iter().flatten() {
        let (owner, mode) = if drive.read_only {
            (0, 0o644)
        } else {
            (uid, 0o600)
        };
        let image = &drive.image;
        std::os::unix::fs::chown(image, Some(owner), Some(owner))
            .and_then(|()| std::fs::set_permissions(image, std::fs::Permissions::from_mode(mode)))
            .map_err(CoreError::io("give QEMU", image))?;
    }
    Ok(())
}

/// Record the layout of `r`'s guest in the snapshot directory `dir`.
pub(super) fn write_layout(cfg: &Config, r: &SandboxRecord, dir: &Path) -> CoreResult<()> {
    let slots = plan(cfg, r)?.slots;
    let file = dir.join(LAYOUT_FILE);
    let json = serde_json::to_vec(&slots).map_err(CoreError::Encode)?;
    std::fs::write(&file, json).map_err(CoreError::io("write", file))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(volume: &str, path: &str, read_only: bool) -> VolumeMount {
        VolumeMount {
            volume: volume.into(),
            path: path.into(),
            read_only,
        }
    }

    fn used(volume: &str, path: &str, read_only: bool) -> Slot {
        Slot::Volume {
            volume: volume.into(),
            path: path.into(),
            read_only,
        }
    }

    #[test]
    fn a_bake_gives_slots_in_order_and_the_agent_mounts_them() {
        let empty = vec![Slot::Empty; VOLUME_SLOTS];
        let p = assign(
            &empty,
            &[mount("vol_a", "/data", false), mount("vol_b", "/ref", true)],
            false,
        )
        .expect("fits");
        assert_eq!(p.slots[0], used("vol_a", "/data", false));
        assert_eq!(p.slots[1], used("vol_b", "/ref", true));
        assert_eq!(p.slots[2], Slot::Empty);
        assert!(p.unmount.is_empty());
        let serials: Vec<_> = p.mount.iter().map(|g| g.serial.as_str()).collect();
        assert_eq!(serials, ["hutch-vol0", "hutch-vol1"]);
        assert!(p.mount[1].read_only);
    }

    #[test]
    fn a_fork_child_keeps_read_only_volumes_and_drops_the_read_write_one() {
        let parent = vec![
            used("vol_a", "/data", false),
            used("vol_b", "/ref", true),
            Slot::Empty,
            Slot::Empty,
        ];
        // What manager/fork.rs gives a child: the read-only volumes only.
        let p = assign(&parent, &[mount("vol_b", "/ref", true)], true).expect("fits");
        assert_eq!(p.slots[0], Slot::Dropped);
        assert_eq!(p.slots[1], used("vol_b", "/ref", true));
        assert_eq!(p.unmount, ["/data"]);
        assert!(p.mount.is_empty(), "the kept volume is already mounted");
        // A wake of that child: the same layout, nothing for the agent.
        let again = assign(&p.slots, &[mount("vol_b", "/ref", true)], true).expect("fits");
        assert_eq!(again.slots, p.slots);
    }

    #[test]
    fn a_snapshot_create_trusts_no_volume_of_the_snapshot() {
        let snap = vec![
            used("vol_b", "/ref", true),
            Slot::Empty,
            Slot::Dropped,
            Slot::Empty,
        ];
        let p = assign(&snap, &[mount("vol_b", "/ref", true)], false).expect("fits");
        assert_eq!(p.slots[0], Slot::Dropped);
        assert_eq!(p.slots[1], used("vol_b", "/ref", true));
        assert_eq!(p.unmount, ["/ref"]);
        assert_eq!(p.mount.len(), 1);
        assert_eq!(p.mount[0].serial, "hutch-vol1");
    }

    #[test]
    fn too_many_volumes_for_the_free_slots_is_a_clear_error() {
        let snap = vec![Slot::Dropped, Slot::Dropped, Slot::Dropped, Slot::Empty];
        let wanted = [mount("vol_a", "/a", false), mount("vol_b", "/b", false)];
        let err = assign(&snap, &wanted, false).expect_err("one free slot");
        assert!(matches!(err, CoreError::InvalidArgument(_)), "{err}");
    }
}
