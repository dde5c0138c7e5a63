"""Former home of :mod:`inorder.endpoints` (where the broker, S3 store and registry are).

Kept so that code written against earlier releases (``from inorder.dev.endpoints import
kafka_bootstrap_servers``) keeps working; new code imports :mod:`inorder.endpoints`.
"""

from __future__ import annotations

from inorder.endpoints import ENV_ACCESS_KEY as ENV_ACCESS_KEY
from inorder.endpoints import ENV_KAFKA as ENV_KAFKA
from inorder.endpoints import ENV_REGION as ENV_REGION
from inorder.endpoints import ENV_S3_BUCKET as ENV_S3_BUCKET
from inorder.endpoints import ENV_S3_ENDPOINT as ENV_S3_ENDPOINT
from inorder.endpoints import ENV_SCHEMA_REGISTRY as ENV_SCHEMA_REGISTRY
from inorder.endpoints import ENV_SECRET_KEY as ENV_SECRET_KEY
from inorder.endpoints import ENV_STATE_DIR as ENV_STATE_DIR
from inorder.endpoints import S3Settings as S3Settings
from inorder.endpoints import kafka_bootstrap_servers as kafka_bootstrap_servers
from inorder.endpoints import output_storage_options as output_storage_options
from inorder.endpoints import read_services_file as read_services_file
from inorder.endpoints import resolve_state_dir as resolve_state_dir
from inorder.endpoints import s3_settings as s3_settings
from inorder.endpoints import schema_registry_url as schema_registry_url
