"""The status page (``inorder ui``): a read-only, live view of one pipeline's checkpoint.

* every run records each batch's progress line beside the checkpoint
  (:mod:`inorder.pipeline.batch_history`: Spark's logs do not keep where a batch's time went,
  nor its output counts);
* :mod:`inorder.ui.status` gathers what the page shows from the checkpoint, the output,
  that history and the broker;
* :mod:`inorder.ui.charts` and :mod:`inorder.ui.page` render it as HTML with inline SVG;
* :mod:`inorder.ui.app` is the web application (token, limits, no stack traces) and
  :mod:`inorder.ui.server` serves it, in the foreground or beside a running pipeline.
"""
