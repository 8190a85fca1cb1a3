/*
 * server.h - `sampan serve`, the composition root: flags, wiring of the
 * floors below (serving, the protocols, the transport), health routes,
 * signals and drain (serve.c).
 */
#ifndef SP_SERVER_SERVER_H
#define SP_SERVER_SERVER_H

int sp_cmd_serve(int argc, char **argv);

#endif /* SP_SERVER_SERVER_H */
