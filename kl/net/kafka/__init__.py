"""Today's Kafka protocol, served by ``kl serve --kafka``: the front end (``frontend``:
decoding, dispatch, encoding), what every handler shares (``broker``), one module per
request family (``produce``, ``fetch``, ``list_offsets``, ``metadata``, ``groups`` over the
``coordinator``, ``topics``, ``delete_records``, ``cluster``, ``transactions``), the record
conversion (``records``) and the error codes (``errors``)."""
