package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// store is the file system the data store lives on: an ext4 image of its own, mounted
// over the data directory, so that the soak can stall it with fsfreeze. A frozen file
// system makes every write to it (the executor's, a pod's) wait in the kernel until it
// thaws, as a stalled network file system or a storage snapshot would; reads of what is
// cached go on. It needs root (mount, fsfreeze); without it the soak runs without the
// stall-store fault and says so.
type store struct {
	image, dir string
}

// mountStore makes a sparse 4 GiB ext4 image in imageDir and mounts it on dir.
func mountStore(ctx context.Context, imageDir, dir string) (*store, error) {
	st := &store{image: filepath.Join(imageDir, "store.img"), dir: dir}
	f, err := os.Create(st.image)
	if err == nil {
		err = f.Truncate(4 << 30)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := run(ctx, "mkfs.ext4", "-q", "-F", "-E", "nodiscard", st.image); err != nil {
		return nil, err
	}
	if err := run(ctx, "mount", "-o", "loop", st.image, dir); err != nil {
		return nil, err
	}
	return st, nil
}

func (st *store) freeze(ctx context.Context) error { return run(ctx, "fsfreeze", "--freeze", st.dir) }
func (st *store) thaw(ctx context.Context) error   { return run(ctx, "fsfreeze", "--unfreeze", st.dir) }

// unmount thaws (should a run end mid-stall) and unmounts the store; the loop device
// goes with it.
func (st *store) unmount() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = st.thaw(ctx)
	if run(ctx, "umount", st.dir) != nil {
		_ = run(ctx, "umount", "--lazy", st.dir)
	}
}

func run(ctx context.Context, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}
