//! Reading `/proc/self/mountinfo`.
//!
//! Teardown must never delete through a mount point (a recursive delete through the idmapped
//! bind of the template would destroy the template), and cgroup discovery needs the mount
//! points and options of every cgroup hierarchy. Both read this file.

use std::path::{Path, PathBuf};

use crate::sys::SysError;

/// One line of `mountinfo` (see proc(5)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountEntry {
    /// Where it is mounted, with `\040`-style escapes decoded.
    pub mount_point: PathBuf,
    /// Filesystem type (`overlay`, `cgroup`, `cgroup2`, …).
    pub fstype: String,
    /// Per-superblock options (for `cgroup`: the controllers, e.g. `rw,memory`).
    pub super_options: String,
}

/// Decode the octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` backslash) the
/// kernel uses in mountinfo paths.
pub fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let oct = &bytes[i + 1..i + 4];
            if oct.iter().all(|b| (b'0'..=b'7').contains(b)) {
                let v = oct
                    .iter()
                    .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
                if let Ok(byte) = u8::try_from(v) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parse one mountinfo line; `None` for a malformed one.
pub(crate) fn parse_line(line: &str) -> Option<MountEntry> {
    // 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ');
    let _mount_id = l.next()?;
    let _parent_id = l.next()?;
    let _dev = l.next()?;
    let _root = l.next()?;
    let mount_point = l.next()?;
    let mut r = right.split(' ');
    let fstype = r.next()?;
    let _source = r.next()?;
    let super_options = r.next().unwrap_or("");
    Some(MountEntry {
        mount_point: PathBuf::from(unescape(mount_point)),
        fstype: fstype.to_string(),
        super_options: super_options.to_string(),
    })
}

/// Parse a whole mountinfo text, skipping malformed lines.
pub(crate) fn parse(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

/// Read and parse `/proc/self/mountinfo`.
pub(crate) fn read() -> Result<Vec<MountEntry>, SysError> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| SysError::io("read /proc/self/mountinfo", &e))?;
    Ok(parse(&text))
}

/// Mount points at `dir` or beneath it (component-wise), deepest first, so they can be
/// unmounted in order.
pub(crate) fn mounts_at_or_under(entries: &[MountEntry], dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = entries
        .iter()
        .filter(|e| e.mount_point.starts_with(dir))
        .map(|e| e.mount_point.clone())
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
90 27 0:40 / /srv/sbx/a\\040b/lower ro,relatime,idmapped - ext4 /dev/vda rw
91 27 0:41 / /srv/sbx/a\\040b/merged rw,relatime shared:5 - overlay overlay rw,lowerdir=/x
92 27 0:42 / /srv/sbx/a\\040bc/merged rw - overlay overlay rw
garbage line
";

    #[test]
    fn parses_fields_and_escapes() {
        let e = parse(SAMPLE);
        assert_eq!(e.len(), 7);
        assert_eq!(e[2].mount_point, PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(e[2].fstype, "cgroup");
        assert_eq!(e[2].super_options, "rw,memory");
        assert_eq!(e[4].mount_point, PathBuf::from("/srv/sbx/a b/lower"));
        assert_eq!(e[5].fstype, "overlay");
    }

    #[test]
    fn unescape_handles_edge_cases() {
        assert_eq!(unescape("a\\040b"), "a b");
        assert_eq!(unescape("a\\134b"), "a\\b");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
        assert_eq!(unescape("\\"), "\\");
        assert_eq!(unescape("no escapes"), "no escapes");
    }

    #[test]
    fn finds_mounts_under_a_dir_component_wise() {
        let e = parse(SAMPLE);
        let under = mounts_at_or_under(&e, Path::new("/srv/sbx/a b"));
        assert_eq!(
            under,
            vec![
                PathBuf::from("/srv/sbx/a b/lower"),
                PathBuf::from("/srv/sbx/a b/merged")
            ]
        );
        // `/srv/sbx/a bc` is a sibling, not beneath `/srv/sbx/a b`.
        assert!(mounts_at_or_under(&e, Path::new("/srv/sbx/nothing")).is_empty());
    }
}
