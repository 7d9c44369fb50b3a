/*
 * kclpy-spark: Hadoop's raw local filesystem, with permissions set through java.nio.
 *
 * Without Hadoop's native library (pip's pyspark ships none), RawLocalFileSystem sets the mode of
 * every folder it makes and every file it creates by starting a `chmod` process: about 5 ms of CPU
 * each on a 2-core machine, some thirty per batch written by the Parquet sink. This class sets the
 * same permission bits with one system call in the JVM. Hadoop's own way is kept where java.nio
 * would do otherwise than chmod: a mode with the sticky bit, a folder that has setuid or setgid
 * set (chmod keeps a folder's setgid bit, which a group-shared output folder relies on; java.nio
 * would clear it), and a filesystem without POSIX attributes (not Linux).
 *
 * Built into kclpy-spark-localfs.jar by scripts/build_localfs_jar.sh; used by the Parquet sink's
 * writes on local[N] targets (kclpy_spark/spark/local_fs.py).
 */
package kclpyspark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public class NoForkLocalFileSystem extends RawLocalFileSystem {
  // Bit i of a mode (0 = others' execute ... 8 = owner's read).
  private static final PosixFilePermission[] BITS = {
    PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE,
    PosixFilePermission.OTHERS_READ, PosixFilePermission.GROUP_EXECUTE,
    PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE,
    PosixFilePermission.OWNER_READ,
  };

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    short mode = permission.toShort();
    if ((mode & ~0777) != 0) {
      super.setPermission(p, permission);
      return;
    }
    java.nio.file.Path path = pathToFile(p).toPath();
    Set<PosixFilePermission> chosen = EnumSet.noneOf(PosixFilePermission.class);
    for (int i = 0; i < BITS.length; i++) {
      if ((mode & (1 << i)) != 0) {
        chosen.add(BITS[i]);
      }
    }
    try {
      boolean setId = Files.isDirectory(path)
          && (((Integer) Files.getAttribute(path, "unix:mode")) & 06000) != 0;
      if (setId) {
        super.setPermission(p, permission);
        return;
      }
      Files.setPosixFilePermissions(path, chosen);
    } catch (UnsupportedOperationException | IllegalArgumentException e) {
      super.setPermission(p, permission);
    }
  }
}
