"""TaskFlow decorators: ``@task.horovod`` (training) and ``@task.ray`` (one function on the cluster),
registered through the provider info's ``task-decorators``."""
