//! h5i: the box lifecycle.
