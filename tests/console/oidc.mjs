// The identity provider of the console's single sign-on test: panva's oidc-provider (a certified
// OpenID Provider, from npm) with its development sign-in pages, in this process. Any login name
// signs in as that email, in the groups GROUPS gives it.

import Provider from 'oidc-provider';

export const SSO_CLIENT = { id: 'aigw-console', secret: 'console-test-secret' };

/** Groups by login (email); anyone else is in no group. */
export const GROUPS = {
  'sam@acme.test': ['aigw-admins'],
};

export async function startIdp(port, redirectUri) {
  const issuer = `http://127.0.0.1:${port}`;
  const provider = new Provider(issuer, {
    clients: [{
      client_id: SSO_CLIENT.id,
      client_secret: SSO_CLIENT.secret,
      redirect_uris: [redirectUri],
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic',
    }],
    claims: { openid: ['sub'], email: ['email', 'email_verified'], groups: ['groups'] },
    scopes: ['openid', 'email', 'profile', 'groups'],
    conformIdTokenClaims: false,
    pkce: { required: () => true },
    cookies: { keys: ['console-test-cookie-key'] },
    async findAccount(_ctx, id) {
      return {
        accountId: id,
        async claims() {
          return { sub: id, email: id, email_verified: true, groups: GROUPS[id] || [] };
        },
      };
    },
  });
  const server = provider.listen(port, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  return { issuer, close: () => new Promise((r) => server.close(r)) };
}
