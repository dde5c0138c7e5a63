"""Where bytes live: local paths and S3, for the state store, the sinks, the archive and ops.

:mod:`inorder.storage.fs` resolves a location and offers the few operations the rest needs
(small objects, create-only writes, listing, publishing by rename or copy);
:mod:`inorder.storage.s3_objects` does small objects and create-only writes on S3 through
obstore. Failures are :class:`~inorder.errors.StorageError`: one line, no credentials.
"""
