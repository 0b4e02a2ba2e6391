//! A btrfs filesystem of a test host's own (tests/common/cluster.rs): a
//! file made into btrfs, mounted through a loop device inside the host's
//! mount namespace at a path every host of the test shares, as each
//! machine would have its own disk at the same mount point. Dropping it
//! unmounts it inside the host (if the host still runs), detaches every
//! loop device of the file and removes the file, also after a failure.

use super::cluster::Host;
use super::hosts::{output, run_in};
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct HostBtrfs {
    /// The host's init when mounted: unmounting needs its namespace.
    init: i32,
    image: PathBuf,
    pub mount: PathBuf,
}

impl HostBtrfs {
    /// A `size_mb` btrfs at `mount` (made if missing) inside `host`, backed
    /// by `image` (created, a sparse file).
    pub fn new(host: &Host, image: &Path, mount: &Path, size_mb: u64) -> HostBtrfs {
        std::fs::create_dir_all(mount).expect("mount point");
        let f = std::fs::File::create(image).expect("btrfs image");
        f.set_len(size_mb << 20).expect("size the btrfs image");
        drop(f);
        let g = HostBtrfs {
            init: host.init_pid(),
            image: image.to_path_buf(),
            mount: mount.to_path_buf(),
        };
        let mut mkfs = Command::new("mkfs.btrfs");
        mkfs.args(["-q", "-f"]).arg(image);
        let out = output(mkfs);
        assert!(out.status.success(), "mkfs.btrfs {}: {}", image.display(), out.show());
        let (img, mnt) = (image.to_string_lossy(), mount.to_string_lossy());
        let out = run_in(host, 30, &["mount", "-o", "loop", &img, &mnt]);
        assert!(out.status.success(), "mount {img} in {}: {}", host.name, out.show());
        g
    }

    /// The btrfs in `image` (made by `new`, its host since restarted,
    /// as a machine comes back with its disk) mounted again at `mount`
    /// inside `host`, once the loop device of its last mount is gone.
    pub fn mount_again(host: &Host, image: &Path, mount: &Path) -> HostBtrfs {
        let g = HostBtrfs {
            init: host.init_pid(),
            image: image.to_path_buf(),
            mount: mount.to_path_buf(),
        };
        let detached = super::wait_for(std::time::Duration::from_secs(20), || g.loops().is_empty());
        assert!(detached, "{} is still attached: {:?}", image.display(), g.loops());
        let (img, mnt) = (image.to_string_lossy(), mount.to_string_lossy());
        let out = run_in(host, 30, &["mount", "-o", "loop", &img, &mnt]);
        assert!(out.status.success(), "mount {img} again in {}: {}", host.name, out.show());
        g
    }

    /// `btrfs subvolume create` of `name` under the mount point, inside
    /// `host`; its path.
    pub fn subvolume(&self, host: &Host, name: &str) -> PathBuf {
        let p = self.mount.join(name);
        let out = run_in(host, 30, &["btrfs", "subvolume", "create", &p.to_string_lossy()]);
        assert!(out.status.success(), "btrfs subvolume create in {}: {}", host.name, out.show());
        p
    }

    /// Loop devices attached to the image (`losetup -j`).
    fn loops(&self) -> Vec<String> {
        let out = Command::new("losetup").arg("-j").arg(&self.image).output();
        let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
        text.lines().filter_map(|l| l.split(':').next()).map(String::from).collect()
    }
}

impl Drop for HostBtrfs {
    fn drop(&mut self) {
        if Path::new(&format!("/proc/{}/ns/mnt", self.init)).exists() {
            let _ = Command::new("nsenter")
                .args(["-t", &self.init.to_string(), "-m", "--", "umount", "-l"])
                .arg(&self.mount)
                .output();
        }
        for dev in self.loops() {
            let _ = Command::new("losetup").args(["-d", &dev]).output();
        }
        let _ = std::fs::remove_file(&self.image);
    }
}
