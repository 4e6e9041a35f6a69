// Package layering holds, in its test, which packages must not depend on which: the
// boundaries between the layers that a package's imports alone do not show, since a
// dependency can come in through another package.
package layering
