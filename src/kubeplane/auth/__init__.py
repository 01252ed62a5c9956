"""Who is asking, and may they: authentication, authorization and the
identity of the request being served.

:mod:`kubeplane.auth.user` holds the user a request is made by; the HTTP front
end and the local wire server set it for the request (:func:`current_user`),
and everything below them (admission, the registry's subresources) reads it
from there rather than from a parameter threaded through every call.
"""
