"""Where librdkafka's own log lines go.

librdkafka logs every failed connection attempt (dozens a second against an unreachable
broker) straight to stderr. inorder reports the problem itself in one line, so the client
logs go to the ``inorder.kafka`` logger, which by default keeps them to itself. To see them::

    logging.getLogger("inorder.kafka").propagate = True
"""

from __future__ import annotations

import logging

KAFKA_LOG = logging.getLogger("inorder.kafka")
KAFKA_LOG.addHandler(logging.NullHandler())
KAFKA_LOG.propagate = False
